// The process-wide phase timers; see timers.h.
#include "diffsoft/core/timers.h"

namespace diffsoft {

PhaseTimers& phase_timers() {
  static PhaseTimers timers;
  return timers;
}

}  // namespace diffsoft
