// A Status on the wire: StepResult and TransferResult (proto/control.proto)
// carry the failing Status's code in `code` beside its text in `error`, so
// that the coordinator can act on the code (Unavailable: retry; Aborted:
// retry higher up; InvalidArgument: do not) without parsing the text.
#pragma once

#include <cstdint>
#include <string>

#include "common/status.h"

namespace headway {

// The value for a result's `code` field: StatusCode's numeric value (0 for
// kOk; the values are fixed in common/status.h).
uint32_t StatusCodeToProto(StatusCode code);

// The Status that a result's `code` and `error` (`message`) describe:
//   code 0, message empty       -> OK;
//   code 0, message non-empty   -> Internal (a sender that filled the error
//                                  but named no code), message kept;
//   a known non-zero code       -> that code with `message` (may be empty);
//   a code above kMaxStatusCode -> Internal, message "unknown status code N: "
//                                  + `message` (a newer sender).
// `message` is kept as sent: for a worker's StepResult it already starts
// with the code's name ("Unavailable: ..."), as the worker sends
// Status::ToString().
Status StatusFromProto(uint32_t code, const std::string& message);

}  // namespace headway
