#include "compiler/reference_kernel.h"

#include "absl/strings/str_cat.h"
#include "graph/ops.h"
#include "kernels/core/status.h"

namespace sg::compiler {
namespace {

template <typename T>
void Read(const TensorView& t, std::vector<double>& out) {
  const T* p = t.data<T>();
  for (int64_t i = 0; i < t.numel(); ++i) {
    if constexpr (std::is_same_v<T, BFloat16> || std::is_same_v<T, Half>) {
      out[i] = p[i].ToFloat();
    } else {
      out[i] = double(p[i]);
    }
  }
}

template <typename T>
void Write(const std::vector<double>& in, const TensorView& t) {
  T* p = t.data<T>();
  for (int64_t i = 0; i < t.numel(); ++i) {
    if constexpr (std::is_same_v<T, BFloat16> || std::is_same_v<T, Half>) {
      p[i] = T::FromFloat(float(in[i]));
    } else {
      p[i] = T(in[i]);
    }
  }
}

}  // namespace

graph::HostTensor ToHostTensor(const TensorView& t) {
  graph::HostTensor h = graph::HostTensor::Zeros(t.shape(), t.dtype());
  switch (t.dtype()) {
    case DType::kF32: Read<float>(t, h.data); break;
    case DType::kBF16: Read<BFloat16>(t, h.data); break;
    case DType::kF16: Read<Half>(t, h.data); break;
    case DType::kI32: Read<int32_t>(t, h.data); break;
    case DType::kI64: Read<int64_t>(t, h.data); break;
  }
  return h;
}

absl::Status FromHostTensor(const graph::HostTensor& h, const TensorView& t) {
  SG_CHECK_ARG(t.device().is_cpu() && t.is_contiguous(), "FromHostTensor: expected a contiguous CPU tensor, found ",
               t.ToString());
  SG_CHECK_ARG(h.numel() == t.numel(), "FromHostTensor: ", h.numel(), " values for ", t.ToString());
  switch (t.dtype()) {
    case DType::kF32: Write<float>(h.data, t); break;
    case DType::kBF16: Write<BFloat16>(h.data, t); break;
    case DType::kF16: Write<Half>(h.data, t); break;
    case DType::kI32: Write<int32_t>(h.data, t); break;
    case DType::kI64: Write<int64_t>(h.data, t); break;
  }
  return absl::OkStatus();
}

absl::StatusOr<ReferenceKernel> ReferenceKernel::Create(
    const graph::Node& node, const std::vector<std::pair<DType, Shape>>& inputs) {
  auto g = std::make_shared<graph::Graph>();
  std::vector<int> ids;
  std::vector<graph::Type> in_types;
  for (size_t i = 0; i < inputs.size(); ++i) {
    graph::Type t{inputs[i].first, graph::ToSymShape(inputs[i].second)};
    in_types.push_back(t);
    ids.push_back(g->AddNode(graph::OpKind::kInput, {},
                             {{"name", absl::StrCat("in", i)}, {"shape", t.shape}, {"dtype", t.dtype}},
                             {t})[0]);
  }
  auto out_types = graph::InferTypes(node.op, in_types, node.attrs);
  if (!out_types.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("reference kernel for ", graph::OpName(node.op), ": ",
                                                   out_types.status().message()));
  }
  std::vector<int> outs = g->AddNode(node.op, ids, node.attrs, *out_types);
  for (size_t k = 0; k < outs.size(); ++k) g->AddOutput(absl::StrCat("out", k), outs[k]);
  SG_RETURN_IF_ERROR(graph::Verify(*g));
  ReferenceKernel k;
  k.graph_ = std::move(g);
  return k;
}

absl::Status ReferenceKernel::Run(const std::vector<TensorView>& inputs,
                                  const std::vector<TensorView>& outputs) const {
  graph::Feeds feeds;
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (!inputs[i].device().is_cpu()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "reference kernel: runs on the CPU only, found input ", inputs[i].ToString()));
    }
    feeds[absl::StrCat("in", i)] = ToHostTensor(inputs[i]);
  }
  SG_ASSIGN_OR_RETURN(graph::Feeds out, graph::Interpret(*graph_, feeds));
  for (size_t k = 0; k < outputs.size(); ++k) {
    SG_RETURN_IF_ERROR(FromHostTensor(out.at(absl::StrCat("out", k)), outputs[k]));
  }
  return absl::OkStatus();
}

}  // namespace sg::compiler
