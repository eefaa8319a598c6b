// The only translation unit that sees Python: builds diffsoft._C.
#include <torch/csrc/Exceptions.h>
#include <torch/extension.h>

#include "diffsoft/core/parallel.h"
#include "diffsoft/core/solver.h"
#include "diffsoft/core/timers.h"
#include "ops.h"
#include "diffsoft/physics/step_solver.h"

namespace py = pybind11;
using diffsoft::AnalyticEnergy;
using diffsoft::EnergyFn;
using diffsoft::SolveInfo;
using diffsoft::SolverOptions;
using torch::Tensor;

namespace {

// A Python object that C++ may copy and drop without the GIL: the last copy drops it with the GIL held.
template <typename T>
std::shared_ptr<T> held(T fn) {
  return std::shared_ptr<T>(new T(std::move(fn)), [](T* f) {
    if (!Py_IsInitialized()) {  // interpreter gone: nothing left to decref
      f->release();
      delete f;
      return;
    }
    py::gil_scoped_acquire gil;
    delete f;
  });
}

// A Python exception as torch's python_error, which the autograd engine carries to backward()'s caller and
// restores there: the energy's own exception then reaches the user from a backward too, not a RuntimeError
// naming it.
[[noreturn]] void throw_python_error(py::error_already_set& e) {
  e.restore();
  python_error error;
  error.persist();
  throw error;
}

// A Python energy as a C++ EnergyFn. The C++ solver calls it without the GIL (LibTorch refuses to run
// autograd while it is held), from the caller's thread in the forward and from the autograd engine in the
// backward; each call takes the GIL.
EnergyFn python_energy(py::function fn) {
  std::shared_ptr<py::function> callable = held(std::move(fn));
  return [callable](const torch::Tensor& x, const std::vector<torch::Tensor>& params) {
    py::gil_scoped_acquire gil;
    py::tuple args(1 + params.size());
    args[0] = py::cast(x);
    for (size_t i = 0; i < params.size(); ++i) args[1 + i] = py::cast(params[i]);
    py::object out;
    try {
      out = (*callable)(*args);
    } catch (py::error_already_set& e) {
      throw_python_error(e);
    }
    if (!THPVariable_Check(out.ptr())) {
      throw std::invalid_argument("energy must return a torch.Tensor, got " +
                                  std::string(py::str(py::type::of(out).attr("__name__"))));
    }
    return out.cast<torch::Tensor>();
  };
}

// diffsoft._compat.batched_vjp as the core's BatchedVjp (torch's vmap over the backward is Python's alone):
// called without the GIL like an energy, it takes it; None (torch cannot batch this graph) is undefined.
diffsoft::BatchedVjp python_batched_vjp(py::function fn) {
  std::shared_ptr<py::function> callable = held(std::move(fn));
  return [callable](const torch::Tensor& output, const torch::Tensor& input, const torch::Tensor& v) {
    py::gil_scoped_acquire gil;
    py::object out;
    try {
      out = (*callable)(output, input, v);
    } catch (py::error_already_set& e) {
      throw_python_error(e);
    }
    return out.is_none() ? torch::Tensor() : out.cast<torch::Tensor>();
  };
}

PyObject* convergence_error_type = nullptr;  // diffsoft._C.ConvergenceError, set at import

// A failed adjoint solve as diffsoft.ConvergenceError carrying the solve's record in .info, thrown as a
// python_error so that the autograd engine hands backward()'s caller that very exception.
diffsoft::RaiseFn python_convergence_error(std::shared_ptr<SolveInfo> info) {
  return [info](const std::string& message) {
    py::gil_scoped_acquire gil;
    py::object error = py::reinterpret_borrow<py::object>(convergence_error_type)(message);
    error.attr("info") = py::cast(info);
    PyErr_SetObject(convergence_error_type, error.ptr());
    python_error e;
    e.persist();
    throw e;
  };
}

// SolveInfo as a tuple of its fields, for pickling (multiprocessing, ConvergenceError.info).
py::tuple solve_info_state(const SolveInfo& i) {
  return py::make_tuple(i.converged, i.iterations, i.cg_iterations, i.hvp_count, i.factorizations,
                        i.line_search_steps, i.fallback_steps, i.energy, i.grad_norm, i.grad_norm_initial,
                        i.problem_converged, i.message, i.backward_ran, i.backward_converged, i.backward_cg_iterations,
                        i.backward_direct, i.backward_residual, i.backward_message);
}

std::shared_ptr<SolveInfo> solve_info_from(const py::tuple& t) {
  if (t.size() != 18) throw std::invalid_argument("SolveInfo: a pickled state of 18 fields expected");
  auto i = std::make_shared<SolveInfo>();
  i->converged = t[0].cast<bool>();
  i->iterations = t[1].cast<int64_t>();
  i->cg_iterations = t[2].cast<int64_t>();
  i->hvp_count = t[3].cast<int64_t>();
  i->factorizations = t[4].cast<int64_t>();
  i->line_search_steps = t[5].cast<int64_t>();
  i->fallback_steps = t[6].cast<int64_t>();
  i->energy = t[7].cast<double>();
  i->grad_norm = t[8].cast<double>();
  i->grad_norm_initial = t[9].cast<double>();
  i->problem_converged = t[10].cast<std::vector<bool>>();
  i->message = t[11].cast<std::string>();
  i->backward_ran = t[12].cast<bool>();
  i->backward_converged = t[13].cast<bool>();
  i->backward_cg_iterations = t[14].cast<int64_t>();
  i->backward_direct = t[15].cast<bool>();
  i->backward_residual = t[16].cast<double>();
  i->backward_message = t[17].cast<std::string>();
  return i;
}

// diffsoft.fused._UserTerms (a user's torch terms) as the kernels' ExtraTerms: each call takes the GIL, and a
// Python exception passes through as the energy's would.
std::shared_ptr<const diffsoft::ExtraTerms> python_extra_terms(py::object terms, int64_t first_param) {
  std::shared_ptr<py::object> obj = held(std::move(terms));
  auto call = [obj](const char* name, auto&&... args) {
    try {
      return obj->attr(name)(std::forward<decltype(args)>(args)...);
    } catch (py::error_already_set& e) {
      throw_python_error(e);
    }
  };
  auto extra = std::make_shared<diffsoft::ExtraTerms>();
  extra->first_param = first_param;
  extra->value = [call](const Tensor& y) {
    py::gil_scoped_acquire gil;
    return call("value", y).template cast<Tensor>();
  };
  extra->derivatives = [call](const Tensor& y) {
    py::gil_scoped_acquire gil;
    return call("derivatives", y)
        .template cast<std::pair<Tensor, std::vector<std::pair<Tensor, Tensor>>>>();
  };
  extra->mixed_vjp = [call](const Tensor& y, const Tensor& w, const std::vector<int64_t>& wanted) {
    py::gil_scoped_acquire gil;
    return call("mixed_vjp", y, w, wanted).template cast<std::vector<Tensor>>();
  };
  return extra;
}

py::tuple step_param_names() {
  py::tuple names(diffsoft::kNumStepParams);
  for (int k = 0; k < diffsoft::kNumStepParams; ++k) names[k] = py::str(diffsoft::kStepParamNames[k]);
  return names;
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "diffsoft C++ core: Newton-CG minimization with an implicit-function-theorem backward";
  m.attr("TORCH_VERSION") = TORCH_VERSION;

  static py::exception<diffsoft::ConvergenceError> convergence_error(m, "ConvergenceError", PyExc_RuntimeError);
  convergence_error_type = convergence_error.ptr();
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (python_error& e) {  // an energy's own exception (see python_energy)
      e.restore();
    } catch (const diffsoft::ConvergenceError& e) {
      PyErr_SetString(convergence_error_type, e.what());  // not py::exception::operator(), deprecated in pybind11 2.12
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
      .def_readwrite("reuse_factor", &SolverOptions::reuse_factor)
      .def_readwrite("probe_batch", &SolverOptions::probe_batch)
      .def("check", &diffsoft::check_options);

  py::class_<SolveInfo, std::shared_ptr<SolveInfo>>(m, "SolveInfo")
      .def(py::init<>())
      .def_readwrite("converged", &SolveInfo::converged)
      .def_readwrite("iterations", &SolveInfo::iterations)
      .def_readwrite("cg_iterations", &SolveInfo::cg_iterations)
      .def_readwrite("hvp_count", &SolveInfo::hvp_count)
      .def_readwrite("factorizations", &SolveInfo::factorizations)
      .def_readwrite("backward_direct", &SolveInfo::backward_direct)
      .def_readwrite("line_search_steps", &SolveInfo::line_search_steps)
      .def_readwrite("fallback_steps", &SolveInfo::fallback_steps)
      .def_readwrite("energy", &SolveInfo::energy)
      .def_readwrite("grad_norm", &SolveInfo::grad_norm)
      .def_readwrite("grad_norm_initial", &SolveInfo::grad_norm_initial)
      .def_readwrite("problem_converged", &SolveInfo::problem_converged)
      .def_readwrite("message", &SolveInfo::message)
      .def_readwrite("backward_ran", &SolveInfo::backward_ran)
      .def_readwrite("backward_converged", &SolveInfo::backward_converged)
      .def_readwrite("backward_cg_iterations", &SolveInfo::backward_cg_iterations)
      .def_readwrite("backward_residual", &SolveInfo::backward_residual)
      .def_readwrite("backward_message", &SolveInfo::backward_message)
      .def(py::pickle(&solve_info_state, &solve_info_from));

  py::list kinds;
  for (const auto& k : diffsoft::collider_kinds()) kinds.append(py::make_tuple(k.name, py::tuple(py::cast(k.params))));
  m.attr("COLLIDER_KINDS") = kinds;
  m.def("collider_param_rank", &diffsoft::collider_param_rank, py::arg("kind"), py::arg("j"), py::arg("d"),
        "The trailing dimensions of one problem's value of a collider's parameter j (see ops.h).");
  py::class_<diffsoft::FactorCache, std::shared_ptr<diffsoft::FactorCache>>(
      m, "FactorCache", "Symbolic factorizations shared by a model's steps (see step_energy.h).")
      .def(py::init<>())
      .def_readonly("analyses", &diffsoft::FactorCache::analyses)
      .def_readonly("reused", &diffsoft::FactorCache::reused)
      .def(py::pickle([](const diffsoft::FactorCache&) { return py::tuple(); },  // copies start empty
                      [](const py::tuple&) { return std::make_shared<diffsoft::FactorCache>(); }));
  m.attr("HAS_CHOLMOD") = diffsoft::has_cholmod();
  m.attr("HAS_OPENMP") = diffsoft::has_openmp();
  // Testing only (core/parallel.h): the least work a thread of a batch's loop takes; returns the previous value.
  m.def("_set_min_chunk_ns", [](double ns) {
    const double before = diffsoft::min_chunk_ns();
    diffsoft::set_min_chunk_ns(ns);
    return before;
  });
  // Testing and benchmarking only (core/timers.h): switch the phase timers on (zeroed) or off, read them.
  m.def("_phase_timers", [](bool on) {
    auto& t = diffsoft::phase_timers();
    for (size_t k = 0; k < t.ns.size(); ++k) t.ns[k] = 0, t.calls[k] = 0;
    t.on = on;
  });
  m.def("_phase_times", [] {
    auto& t = diffsoft::phase_timers();
    py::dict out;
    for (size_t k = 0; k < t.ns.size(); ++k)
      out[diffsoft::kPhaseNames[k]] = py::make_tuple(1e-9 * double(t.ns[k].load()), t.calls[k].load());
    return out;
  });
  m.attr("STEP_PARAM_NAMES") = step_param_names();
  py::tuple model_fields(diffsoft::kKernelModelFields.size());
  for (size_t k = 0; k < diffsoft::kKernelModelFields.size(); ++k) model_fields[k] = diffsoft::kKernelModelFields[k];
  m.attr("KERNEL_MODEL_FIELDS") = model_fields;
  // The fused step kernels are the operators torch.ops.diffsoft.* (ops.cpp); the solver's analytic path, an
  // opaque handle that _C.minimize reads, stays a binding.
  py::class_<AnalyticEnergy, std::shared_ptr<AnalyticEnergy>>(
      m, "AnalyticEnergy", "An energy's autograd-free value, gradient and Hessian products (see solver.h).");
  m.def(
      "step_analytic_energy",
      [](const std::vector<std::optional<Tensor>>& model, int64_t material, const std::vector<int64_t>& collider_kinds,
         const std::vector<Tensor>& collider_params, std::shared_ptr<diffsoft::FactorCache> factor_cache,
         const Tensor& x0, const Tensor& x0_free, const Tensor& x_hat, const Tensor& activation, bool factorize,
         const std::vector<int64_t>& params, const std::vector<std::vector<int64_t>>& param_shapes,
         const py::object& extra) {
        std::vector<Tensor> tensors;
        for (const auto& t : model) tensors.push_back(t.value_or(Tensor()));
        const int64_t first = diffsoft::kNumStepParams + static_cast<int64_t>(collider_params.size());
        return std::make_shared<AnalyticEnergy>(diffsoft::step_analytic_energy(
            diffsoft::kernel_model(tensors, material, collider_kinds, collider_params, std::move(factor_cache)),
            {Tensor(), x0, x0_free, x_hat, activation}, factorize, params, param_shapes,
            extra.is_none() ? nullptr : python_extra_terms(extra, first)));
      },
      py::arg("model"), py::arg("material"), py::arg("collider_kinds"), py::arg("collider_params"),
      py::arg("factor_cache"), py::arg("x0"), py::arg("x0_free"), py::arg("x_hat"), py::arg("activation"),
      py::arg("factorize") = false, py::arg("params") = std::vector<int64_t>(),
      py::arg("param_shapes") = std::vector<std::vector<int64_t>>(), py::arg("extra") = py::none());

  m.def(
      "minimize",
      [](py::function energy, const Tensor& x0, const std::vector<Tensor>& params, const SolverOptions& options,
         std::shared_ptr<SolveInfo> info, std::shared_ptr<AnalyticEnergy> analytic,
         const std::optional<Tensor>& sparsity, const std::optional<py::function>& batched_vjp) {
        EnergyFn fn = python_energy(std::move(energy));
        diffsoft::RaiseFn raise = python_convergence_error(info);
        diffsoft::BatchedVjp vjp = batched_vjp ? python_batched_vjp(*batched_vjp) : nullptr;
        py::gil_scoped_release no_gil;
        return diffsoft::implicit_minimize(fn, x0, params, options, info, analytic, sparsity.value_or(Tensor()),
                                           std::move(raise), std::move(vjp));
      },
      py::arg("energy"), py::arg("x0"), py::arg("params"), py::arg("options"), py::arg("info"),
      py::arg("analytic") = nullptr, py::arg("sparsity") = py::none(), py::arg("batched_vjp") = py::none(),
      "x* = argmin_x energy(x, *params), differentiable w.r.t. params by the implicit function theorem.");
}
