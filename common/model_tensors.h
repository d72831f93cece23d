// The tensors a model spec needs from its GGUF file, checked against the
// file's tensor list before any worker loads weights, so that metadata and
// tensors that disagree (say `block_count` 100000 over 30 layers of tensors)
// are a startup error of the coordinator and launcher, not of each worker.
//
// Names and shapes follow llama.cpp's GGUF conventions (gguf-py
// `tensor_mapping.py`, ggml order: dims[0] is the row length), as
// worker/model_weights.cc loads them.
#pragma once

#include "common/gguf.h"
#include "common/model_spec.h"
#include "common/status.h"

namespace headway {

// Checks that `file` holds every tensor `spec` needs, with exactly the shape
// the metadata implies: token_embd, output_norm, output (optional: absent =
// tied to token_embd), and per layer the attention and MLP matrices and
// norms (Gemma 3's extra norms for architecture "gemma3"). Stops at the
// first missing layer, so a huge block_count costs one lookup.
// REQUIRES: spec came from LoadModelSpec(file) (positive sizes). Errors:
// NotFound "model <name> (<path>): tensor blk.30.attn_norm.weight is
// missing; the metadata says 100000 layers (llama.block_count), the file
// has tensors for 30" (the layer count only when layers are missing);
// InvalidArgument naming the tensor, its shape and the shape the metadata
// implies.
Status CheckModelTensors(const GgufFile& file, const ModelSpec& spec);

}  // namespace headway
