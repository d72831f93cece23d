#include "comm/gloo_communicator.h"

#include <gloo/allreduce.h>
#include <gloo/barrier.h>
#include <gloo/common/error.h>
#include <gloo/common/logging.h>
#include <gloo/gather.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/device.h>

#include <cstring>
#include <exception>
#include <functional>
#include <vector>

#include "common/net_address.h"

namespace headway {
namespace {

using Clock = std::chrono::steady_clock;

// Gloo's Store interface over a RendezvousStore. Gloo expects failures as
// exceptions; they are caught in RunGloo.
class GlooStoreAdapter final : public gloo::rendezvous::Store {
 public:
  GlooStoreAdapter(RendezvousStore& store, std::string prefix, std::chrono::milliseconds timeout)
      : store_(store), prefix_(std::move(prefix)), timeout_(timeout) {}

  void set(const std::string& key, const std::vector<char>& data) override {
    Status status = store_.Set(prefix_ + key, std::string(data.begin(), data.end()));
    if (!status.ok()) throw gloo::IoException("store set " + key + ": " + status.message());
  }

  std::vector<char> get(const std::string& key) override {
    Result<std::string> value = store_.Get(prefix_ + key, timeout_);
    if (!value.ok()) throw gloo::IoException("store get: " + value.status().message());
    return std::vector<char>(value->begin(), value->end());
  }

  void wait(const std::vector<std::string>& keys) override { wait(keys, timeout_); }

  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override {
    const auto deadline = Clock::now() + timeout;
    for (const std::string& key : keys) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
      Result<std::string> value = store_.Get(prefix_ + key, std::max(left, std::chrono::milliseconds(1)));
      if (!value.ok()) throw gloo::IoException("store wait: " + value.status().message());
    }
  }

 private:
  RendezvousStore& store_;
  const std::string prefix_;
  const std::chrono::milliseconds timeout_;
};

// Runs `fn`, turning any exception into Unavailable("gloo <op>: <cause>").
Status RunGloo(const char* op, const std::function<void()>& fn) {
  try {
    fn();
    return Status::Ok();
  } catch (const gloo::IoException& e) {
    return Status::Unavailable(std::string("gloo ") + op + ": I/O error: " + e.what());
  } catch (const gloo::EnforceNotMet& e) {
    return Status::Unavailable(std::string("gloo ") + op + ": check failed: " + e.what());
  } catch (const std::exception& e) {
    return Status::Unavailable(std::string("gloo ") + op + ": " + e.what());
  } catch (...) {
    return Status::Unavailable(std::string("gloo ") + op + ": unknown exception");
  }
}

class GlooCommunicator final : public Communicator {
 public:
  // `context` is null for a group of size 1.
  GlooCommunicator(int rank, int size, std::chrono::milliseconds timeout,
                   std::shared_ptr<gloo::transport::Device> device,
                   std::shared_ptr<gloo::rendezvous::Context> context)
      : Communicator(rank, size),
        timeout_(timeout),
        device_(std::move(device)),
        context_(std::move(context)) {}

  const char* backend() const override { return "gloo"; }

  Status AllReduceSum(float* data, size_t count) override {
    if (count == 0 || size() == 1) return broken_;
    if (data == nullptr) return Status::InvalidArgument("gloo all-reduce: data is null");
    return Run("all-reduce", [&] {
      gloo::AllreduceOptions opts(context_);
      opts.setOutput(data, count);
      opts.setAlgorithm(gloo::AllreduceOptions::Algorithm::RING);
      opts.setReduceFunction(
          static_cast<void (*)(void*, const void*, const void*, size_t)>(&gloo::sum<float>));
      opts.setTag(NextTag());
      opts.setTimeout(timeout_);
      gloo::allreduce(opts);
    });
  }

  Status Gather(const float* in, size_t count, float* out, int root) override {
    if (root < 0 || root >= size()) {
      return Status::InvalidArgument("gloo gather: root " + std::to_string(root) +
                                     " outside [0, " + std::to_string(size()) + ")");
    }
    if (count > 0 && in == nullptr) return Status::InvalidArgument("gloo gather: in is null");
    if (count > 0 && rank() == root && out == nullptr) {
      return Status::InvalidArgument("gloo gather: out is null on the root");
    }
    if (!broken_.ok()) return broken_;
    if (size() == 1) {
      if (count > 0) std::memmove(out, in, count * sizeof(float));
      return Status::Ok();
    }
    if (count == 0) return Status::Ok();
    return Run("gather", [&] {
      gloo::GatherOptions opts(context_);
      // Gloo only reads the input; its API takes a non-const pointer.
      opts.setInput(const_cast<float*>(in), count);
      if (rank() == root) opts.setOutput(out, count * static_cast<size_t>(size()));
      opts.setRoot(root);
      opts.setTag(NextTag());
      opts.setTimeout(timeout_);
      gloo::gather(opts);
    });
  }

  Status Barrier() override {
    if (size() == 1) return broken_;
    return Run("barrier", [&] {
      gloo::BarrierOptions opts(context_);
      opts.setTag(NextTag());
      opts.setTimeout(timeout_);
      gloo::barrier(opts);
    });
  }

 private:
  Status Run(const char* op, const std::function<void()>& fn) {
    if (!broken_.ok()) return broken_;
    broken_ = RunGloo(op, fn);
    return broken_;
  }

  // Distinct tags keep the messages of back-to-back collectives apart.
  uint32_t NextTag() { return next_tag_++; }

  const std::chrono::milliseconds timeout_;
  // context_ is declared after device_ so that it is destroyed first.
  std::shared_ptr<gloo::transport::Device> device_;
  std::shared_ptr<gloo::rendezvous::Context> context_;
  uint32_t next_tag_ = 0;
  Status broken_;  // the first failure; every later call returns it
};

}  // namespace

Result<std::string> GlooListenAddress(const CommunicatorOptions& options) {
  const std::string& advertise = options.advertise_host;
  if (IsWildcardHost(advertise)) {
    return Status::InvalidArgument("gloo advertise host \"" + advertise +
                                   "\" is a wildcard: must be an address peers can dial");
  }
  HW_ASSIGN_OR_RETURN(const std::string advertise_ip,
                      ResolveHost("gloo advertise host", advertise));
  if (!options.bind_host.empty() && !IsWildcardHost(options.bind_host)) {
    HW_ASSIGN_OR_RETURN(const std::string bind_ip,
                        ResolveHost("gloo bind host", options.bind_host));
    if (bind_ip != advertise_ip) {
      return Status::InvalidArgument(
          "gloo bind host \"" + options.bind_host + "\" (" + bind_ip +
          ") differs from its advertise host \"" + advertise + "\" (" + advertise_ip +
          "): Gloo listens on the address it advertises; bind 0.0.0.0 or the advertised "
          "address");
    }
  }
  if (InterfaceOf(advertise_ip).empty()) {
    return Status::InvalidArgument(
        "gloo advertise host \"" + advertise + "\" (" + advertise_ip +
        ") is on no network interface of this host: Gloo listens on the address it "
        "advertises, so it must be this host's own (not a NAT or load-balancer address)");
  }
  return advertise_ip;
}

Result<std::unique_ptr<Communicator>> CreateGlooCommunicator(const CommunicatorOptions& options,
                                                             RendezvousStore& store) {
  if (options.size == 1) {
    return std::unique_ptr<Communicator>(
        new GlooCommunicator(0, 1, options.timeout, nullptr, nullptr));
  }
  const std::string where = "rank " + std::to_string(options.rank) + " of " +
                            std::to_string(options.size);
  HW_ASSIGN_OR_RETURN(const std::string listen_ip, GlooListenAddress(options));
  std::shared_ptr<gloo::transport::Device> device;
  std::shared_ptr<gloo::rendezvous::Context> context;
  GlooStoreAdapter adapter(store, options.key_prefix + "/gloo/", options.connect_timeout);
  Status status = RunGloo("connect", [&] {
    gloo::transport::tcp::attr attr(listen_ip.c_str());
    device = gloo::transport::tcp::CreateDevice(attr);
    context = std::make_shared<gloo::rendezvous::Context>(options.rank, options.size);
    // Bounds the mesh setup; each collective passes options.timeout itself.
    context->setTimeout(options.connect_timeout);
    context->connectFullMesh(adapter, device);
  });
  if (!status.ok()) {
    return status.WithContext(where + " on " + listen_ip);
  }
  return std::unique_ptr<Communicator>(new GlooCommunicator(
      options.rank, options.size, options.timeout, std::move(device), std::move(context)));
}

}  // namespace headway
