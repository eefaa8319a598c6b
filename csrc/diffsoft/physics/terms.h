// The registered terms of the step energy. step_energy.cpp sums them, and their derivatives, over the rows of
// their stencils: elements, then muscles, then each free vertex (its vertex terms, then its contact with each
// collider); within a stencil, in this list's order. A term is a struct with a stencil and energy, derivatives
// (gradient and Hessian block) and param_grads (first-order and mixed parameter derivatives) for one row
// (elastic.h is an example); adding one is its header and a line here. The collider kinds that Contact
// dispatches over are registered in colliders.h.
#pragma once

#include "diffsoft/physics/contact.h"
#include "diffsoft/physics/elastic.h"
#include "diffsoft/physics/inertia.h"
#include "diffsoft/physics/muscle.h"

namespace diffsoft::kernels {

using StepTerms = TermList<Elastic, Muscle, Inertia, Contact>;

}  // namespace diffsoft::kernels
