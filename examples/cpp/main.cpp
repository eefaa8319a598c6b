// Minimizes E(x; k, b) = sum_i k_i exp(x_i) - b_i x_i with diffsoft's C++ core and backpropagates through the
// minimizer. Closed form: x*_i = log(b_i / k_i), so for L = w . x*, dL/dk = -w / k and dL/db = w / b.
#include <iostream>
#include <memory>
#include <vector>

#include <diffsoft/core/factor.h>
#include <diffsoft/core/solver.h>

namespace {

void print(const char* name, const torch::Tensor& t) {
  std::cout << name;
  for (int64_t i = 0; i < t.numel(); ++i) std::cout << " " << t[i].item<double>();
  std::cout << "\n";
}

}  // namespace

int main() {
  const auto f64 = torch::TensorOptions().dtype(torch::kFloat64);
  torch::manual_seed(0);
  const int64_t n = 5;
  torch::Tensor k = (torch::rand({n}, f64) + 0.5).requires_grad_();
  torch::Tensor b = (torch::rand({n}, f64) + 0.5).requires_grad_();
  torch::Tensor w = torch::randn({n}, f64);

  // Any energy written with torch ops: a 0-dim tensor of x and of the params it may be differentiated by.
  const diffsoft::EnergyFn energy = [](const torch::Tensor& x, const std::vector<torch::Tensor>& p) {
    return (p[0] * x.exp() - p[1] * x).sum();
  };
  diffsoft::SolverOptions options;
  options.rtol = 1e-12;
  auto info = std::make_shared<diffsoft::SolveInfo>();
  // Forward: Newton-CG. The result is a differentiable function of {k, b} (implicit function theorem).
  torch::Tensor x = diffsoft::implicit_minimize(energy, torch::zeros({n}, f64), {k, b}, options, info);
  // Backward: one adjoint solve at x*, whatever the number of Newton iterations.
  x.dot(w).backward();

  std::cout << "forward " << (info->converged ? "converged" : "failed") << " in " << info->iterations
            << " Newton iterations, backward " << (info->backward_converged ? "converged" : "failed")
            << "; built with CHOLMOD: " << (diffsoft::has_cholmod() ? "yes" : "no") << "\n";
  print("x*   ", x.detach());
  print("dL/dk", k.grad());
  print("dL/db", b.grad());

  torch::NoGradGuard no_grad;
  const double x_error = (x - (b / k).log()).abs().max().item<double>();
  const double k_error = (k.grad() + w / k).abs().max().item<double>();
  const double b_error = (b.grad() - w / b).abs().max().item<double>();
  std::cout << "max errors against the closed form: x* " << x_error << ", dL/dk " << k_error << ", dL/db "
            << b_error << "\n";
  const bool ok = info->converged && info->backward_converged && x_error < 1e-10 && k_error < 1e-8 && b_error < 1e-8;
  std::cout << (ok ? "OK" : "FAILED") << "\n";
  return ok ? 0 : 1;
}
