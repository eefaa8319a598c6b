// How the core's messages name the problems of a batch (the Python backends name them alike).
#pragma once

#include <torch/torch.h>

#include <sstream>
#include <string>

namespace diffsoft {

// "0, 3, 7" for the rows marked in a (B,) mask (the first 10, then "and N more").
inline std::string listed(const torch::Tensor& mask) {
  torch::Tensor idx = torch::nonzero(mask.cpu()).flatten();
  std::ostringstream out;
  for (int64_t k = 0; k < idx.numel() && k < 10; ++k) out << (k ? ", " : "") << idx[k].item<int64_t>();
  if (idx.numel() > 10) out << " and " << idx.numel() - 10 << " more";
  return out.str();
}

}  // namespace diffsoft
