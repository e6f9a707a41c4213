//! The pod's one monotonic clock: tokio's, as a `std::time::Instant`, so everything that
//! compares against lease deadlines (the driver, the serving table's readers, pushes)
//! reads the same time, and a paused test clock applies to all of them.
//!
//! Not for: the core (`posgate-core`), which never reads a clock (time is a parameter there).

use std::time::Instant;

/// Now, on tokio's monotonic clock.
pub fn now() -> Instant {
    tokio::time::Instant::now().into_std()
}
