// The only translation unit that sees Python: builds diffsoft._C.
#include <torch/extension.h>

#include "core/solver.h"
#include "physics/step_energy.h"

namespace py = pybind11;
using diffsoft::EnergyFn;
using diffsoft::SolveInfo;
using diffsoft::SolverOptions;

namespace {

// A Python energy as a C++ EnergyFn. The C++ solver calls it without the GIL (LibTorch refuses to run
// autograd while it is held), from the caller's thread in the forward and from the autograd engine in the
// backward; each call takes the GIL, and the last copy drops the Python callable with the GIL held.
EnergyFn python_energy(py::function fn) {
  std::shared_ptr<py::function> callable(new py::function(std::move(fn)), [](py::function* f) {
    if (!Py_IsInitialized()) {  // interpreter gone: nothing left to decref
      f->release();
      delete f;
      return;
    }
    py::gil_scoped_acquire gil;
    delete f;
  });
  return [callable](const torch::Tensor& x, const std::vector<torch::Tensor>& params) {
    py::gil_scoped_acquire gil;
    py::tuple args(1 + params.size());
    args[0] = py::cast(x);
    for (size_t i = 0; i < params.size(); ++i) args[1 + i] = py::cast(params[i]);
    py::object out = (*callable)(*args);
    if (!THPVariable_Check(out.ptr())) {
      throw std::invalid_argument("energy must return a torch.Tensor, got " +
                                  std::string(py::str(py::type::of(out).attr("__name__"))));
    }
    return out.cast<torch::Tensor>();
  };
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "diffsoft C++ core: Newton-CG minimization with an implicit-function-theorem backward";
  m.attr("TORCH_VERSION") = TORCH_VERSION;

  static py::exception<diffsoft::ConvergenceError> convergence_error(m, "ConvergenceError", PyExc_RuntimeError);
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const diffsoft::ConvergenceError& e) {
      convergence_error(e.what());
    } catch (const c10::Error& e) {
      PyErr_SetString(PyExc_RuntimeError, e.what_without_backtrace());
    }
  });

  py::class_<SolverOptions>(m, "SolverOptions")
      .def(py::init<>())
      .def_readwrite("atol", &SolverOptions::atol)
      .def_readwrite("rtol", &SolverOptions::rtol)
      .def_readwrite("max_iter", &SolverOptions::max_iter)
      .def_readwrite("cg_rtol", &SolverOptions::cg_rtol)
      .def_readwrite("cg_max_iter", &SolverOptions::cg_max_iter)
      .def_readwrite("backward_rtol", &SolverOptions::backward_rtol)
      .def_readwrite("backward_max_iter", &SolverOptions::backward_max_iter)
      .def_readwrite("ls_c1", &SolverOptions::ls_c1)
      .def_readwrite("ls_shrink", &SolverOptions::ls_shrink)
      .def_readwrite("ls_max_iter", &SolverOptions::ls_max_iter)
      .def_readwrite("batched", &SolverOptions::batched)
      .def_readwrite("raise_on_failure", &SolverOptions::raise_on_failure)
      .def_readwrite("keep_factor", &SolverOptions::keep_factor)
      .def("check", &diffsoft::check_options);

  py::class_<SolveInfo, std::shared_ptr<SolveInfo>>(m, "SolveInfo")
      .def(py::init<>())
      .def_readonly("converged", &SolveInfo::converged)
      .def_readonly("iterations", &SolveInfo::iterations)
      .def_readonly("cg_iterations", &SolveInfo::cg_iterations)
      .def_readonly("hvp_count", &SolveInfo::hvp_count)
      .def_readonly("factorizations", &SolveInfo::factorizations)
      .def_readonly("backward_direct", &SolveInfo::backward_direct)
      .def_readonly("line_search_steps", &SolveInfo::line_search_steps)
      .def_readonly("energy", &SolveInfo::energy)
      .def_readonly("grad_norm", &SolveInfo::grad_norm)
      .def_readonly("grad_norm_initial", &SolveInfo::grad_norm_initial)
      .def_readonly("problem_converged", &SolveInfo::problem_converged)
      .def_readonly("message", &SolveInfo::message)
      .def_readonly("backward_ran", &SolveInfo::backward_ran)
      .def_readonly("backward_converged", &SolveInfo::backward_converged)
      .def_readonly("backward_cg_iterations", &SolveInfo::backward_cg_iterations)
      .def_readonly("backward_residual", &SolveInfo::backward_residual)
      .def_readonly("backward_message", &SolveInfo::backward_message);

  py::class_<diffsoft::StepModel>(m, "StepModel")
      .def(py::init<>())
      .def_readwrite("elements", &diffsoft::StepModel::elements)
      .def_readwrite("muscles", &diffsoft::StepModel::muscles)
      .def_readwrite("slot", &diffsoft::StepModel::slot)
      .def_readwrite("mass", &diffsoft::StepModel::mass)
      .def_readwrite("Dm_inv", &diffsoft::StepModel::Dm_inv)
      .def_readwrite("mu", &diffsoft::StepModel::mu)
      .def_readwrite("lam", &diffsoft::StepModel::lam)
      .def_readwrite("rest_length", &diffsoft::StepModel::rest_length)
      .def_readwrite("stiffness", &diffsoft::StepModel::stiffness)
      .def_readwrite("material", &diffsoft::StepModel::material)
      .def_readwrite("h", &diffsoft::StepModel::h)
      .def_readwrite("gravity", &diffsoft::StepModel::gravity)
      .def_readwrite("contact_stiffness", &diffsoft::StepModel::contact_stiffness)
      .def_readwrite("friction", &diffsoft::StepModel::friction)
      .def_readwrite("ground", &diffsoft::StepModel::ground)
      .def_readwrite("eps", &diffsoft::StepModel::eps)
      .def_readwrite("has_ground", &diffsoft::StepModel::has_ground)
      .def_readwrite("factor_cache", &diffsoft::StepModel::factor_cache);
  py::class_<diffsoft::FactorCache, std::shared_ptr<diffsoft::FactorCache>>(
      m, "FactorCache", "Symbolic factorizations shared by a model's steps (see step_energy.h).")
      .def(py::init<>())
      .def_readonly("analyses", &diffsoft::FactorCache::analyses)
      .def(py::pickle([](const diffsoft::FactorCache&) { return py::tuple(); },  // copies start empty
                      [](const py::tuple&) { return std::make_shared<diffsoft::FactorCache>(); }));
  m.attr("HAS_CHOLMOD") = diffsoft::has_cholmod();
  // The fused kernels are called from Python autograd Functions (diffsoft.fused), themselves called from the
  // C++ solver: plain C++ with no Python inside, so they drop the GIL for other threads.
  m.def(
      "step_energy_value",
      [](const diffsoft::StepModel& model, const torch::Tensor& y, const torch::Tensor& x0, const torch::Tensor& x0_free,
         const torch::Tensor& x_hat, const torch::Tensor& activation) {
        py::gil_scoped_release no_gil;
        return diffsoft::step_energy_value(model, {y, x0, x0_free, x_hat, activation});
      });
  m.def(
      "step_energy_derivatives",
      [](const diffsoft::StepModel& model, const torch::Tensor& y, const torch::Tensor& x0, const torch::Tensor& x0_free,
         const torch::Tensor& x_hat, const torch::Tensor& activation) {
        py::gil_scoped_release no_gil;
        return diffsoft::step_energy_derivatives(model, {y, x0, x0_free, x_hat, activation});
      });
  m.def(
      "step_energy_param_grads",
      [](const diffsoft::StepModel& model, const torch::Tensor& y, const torch::Tensor& x0, const torch::Tensor& x0_free,
         const torch::Tensor& x_hat, const torch::Tensor& activation, const c10::optional<torch::Tensor>& weight,
         const c10::optional<torch::Tensor>& dir) {
        py::gil_scoped_release no_gil;
        return diffsoft::step_energy_param_grads(model, {y, x0, x0_free, x_hat, activation},
                                                 weight.value_or(torch::Tensor()), dir.value_or(torch::Tensor()));
      },
      py::arg("model"), py::arg("y"), py::arg("x0"), py::arg("x0_free"), py::arg("x_hat"), py::arg("activation"),
      py::arg("weight") = py::none(), py::arg("dir") = py::none());
  m.def("step_energy_hvp", [](const diffsoft::StepModel& model, const std::vector<torch::Tensor>& derivatives,
                              const torch::Tensor& v) {
    py::gil_scoped_release no_gil;
    return diffsoft::step_energy_hvp(model, derivatives, v);
  });

  py::class_<diffsoft::DirectEnergy, std::shared_ptr<diffsoft::DirectEnergy>>(
      m, "DirectEnergy", "An energy's autograd-free value, gradient and Hessian products (see solver.h).");
  m.def(
      "step_direct_energy",
      [](const diffsoft::StepModel& model, const torch::Tensor& x0, const torch::Tensor& x0_free,
         const torch::Tensor& x_hat, const torch::Tensor& activation, bool factorize,
         const std::vector<int64_t>& param_slots, const std::vector<std::vector<int64_t>>& param_shapes) {
        return std::make_shared<diffsoft::DirectEnergy>(diffsoft::step_direct_energy(
            model, {torch::Tensor(), x0, x0_free, x_hat, activation}, factorize, param_slots, param_shapes));
      },
      py::arg("model"), py::arg("x0"), py::arg("x0_free"), py::arg("x_hat"), py::arg("activation"),
      py::arg("factorize") = false, py::arg("param_slots") = std::vector<int64_t>(),
      py::arg("param_shapes") = std::vector<std::vector<int64_t>>());

  m.def(
      "minimize",
      [](py::function energy, const torch::Tensor& x0, const std::vector<torch::Tensor>& params,
         const SolverOptions& options, std::shared_ptr<SolveInfo> info,
         std::shared_ptr<diffsoft::DirectEnergy> direct, const c10::optional<torch::Tensor>& sparsity) {
        EnergyFn fn = python_energy(std::move(energy));
        py::gil_scoped_release no_gil;
        if (sparsity && !direct) {
          direct = std::make_shared<diffsoft::DirectEnergy>(diffsoft::probed_energy(
              fn, params, x0.sizes(), options.batched, *sparsity, std::make_shared<diffsoft::FactorCache>()));
        }
        return diffsoft::implicit_minimize(fn, x0, params, options, info, direct);
      },
      py::arg("energy"), py::arg("x0"), py::arg("params"), py::arg("options"), py::arg("info"),
      py::arg("direct") = nullptr, py::arg("sparsity") = py::none(),
      "x* = argmin_x energy(x, *params), differentiable w.r.t. params by the implicit function theorem.");
}
