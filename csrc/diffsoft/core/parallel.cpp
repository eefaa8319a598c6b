// Whether the core's loops over a batch run on torch's threads; see parallel.h.
#include "diffsoft/core/parallel.h"

namespace diffsoft {

bool has_openmp() {
#ifdef _OPENMP
  return true;
#else
  return false;
#endif
}

}  // namespace diffsoft
