//! Deadlines for D-Bus futures that do not depend on which async runtime zbus runs on.
//!
//! zbus 6 has no blocking API: every call is a future driven by `zbus::block_on`. A timer from
//! zbus's own runtime would tie this code to the `default-rt` backend, so a sleep here is a
//! parked helper thread woken by a condition variable, cancelled when the sleep is dropped. The
//! helper only ever runs a handful of waits per hook, so one thread per wait is cheap enough.

use std::future::{Future, poll_fn};
use std::pin::{Pin, pin};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::task::{Context, Poll, Waker};
use std::time::Instant;

/// A deadline passed before the future finished.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Elapsed;

/// A future that completes at `deadline`.
#[derive(Debug)]
pub struct Sleep {
    deadline: Instant,
    shared: Option<Arc<Shared>>,
}

#[derive(Debug, Default)]
struct Shared {
    state: Mutex<State>,
    wake: Condvar,
}

#[derive(Debug, Default)]
struct State {
    waker: Option<Waker>,
    /// The timer thread is done: it fired, or the sleep was dropped.
    done: bool,
}

impl Sleep {
    pub fn until(deadline: Instant) -> Sleep {
        Sleep {
            deadline,
            shared: None,
        }
    }
}

impl Future for Sleep {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if Instant::now() >= self.deadline {
            return Poll::Ready(());
        }
        if let Some(shared) = &self.shared {
            let mut st = shared.state.lock().unwrap_or_else(PoisonError::into_inner);
            st.waker = Some(cx.waker().clone());
            return Poll::Pending;
        }
        let shared = Arc::new(Shared::default());
        shared
            .state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .waker = Some(cx.waker().clone());
        let deadline = self.deadline;
        let theirs = Arc::clone(&shared);
        let spawned = std::thread::Builder::new()
            .name("dbus-deadline".into())
            .spawn(move || timer_thread(&theirs, deadline));
        if let Err(e) = spawned {
            // Without a timer the deadline could never fire; fail the wait instead of hanging.
            tracing::warn!("cannot start a timer thread ({e}); treating the deadline as passed");
            return Poll::Ready(());
        }
        self.shared = Some(shared);
        Poll::Pending
    }
}

fn timer_thread(shared: &Shared, deadline: Instant) {
    let mut st = shared.state.lock().unwrap_or_else(PoisonError::into_inner);
    loop {
        if st.done {
            return;
        }
        let now = Instant::now();
        if now >= deadline {
            st.done = true;
            let waker = st.waker.take();
            drop(st);
            if let Some(w) = waker {
                w.wake();
            }
            return;
        }
        st = shared
            .wake
            .wait_timeout(st, deadline - now)
            .unwrap_or_else(PoisonError::into_inner)
            .0;
    }
}

impl Drop for Sleep {
    fn drop(&mut self) {
        if let Some(shared) = &self.shared {
            shared
                .state
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .done = true;
            shared.wake.notify_all();
        }
    }
}

/// Run `fut` until it finishes or `deadline` passes, whichever is first.
pub async fn timeout_at<F: Future>(deadline: Instant, fut: F) -> Result<F::Output, Elapsed> {
    let mut fut = pin!(fut);
    let mut sleep = Sleep::until(deadline);
    poll_fn(|cx| {
        if let Poll::Ready(v) = fut.as_mut().poll(cx) {
            return Poll::Ready(Ok(v));
        }
        match Pin::new(&mut sleep).poll(cx) {
            Poll::Ready(()) => Poll::Ready(Err(Elapsed)),
            Poll::Pending => Poll::Pending,
        }
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn a_pending_future_times_out_near_its_deadline() {
        let start = Instant::now();
        let r = zbus::block_on(timeout_at(
            start + Duration::from_millis(80),
            std::future::pending::<()>(),
        ));
        assert_eq!(r, Err(Elapsed));
        let took = start.elapsed();
        assert!(took >= Duration::from_millis(80), "{took:?}");
        assert!(took < Duration::from_secs(2), "{took:?}");
    }

    #[test]
    fn a_ready_future_wins_and_a_past_deadline_fires_at_once() {
        let far = Instant::now() + Duration::from_secs(3600);
        assert_eq!(zbus::block_on(timeout_at(far, async { 7 })), Ok(7));
        let past = Instant::now();
        let r = zbus::block_on(timeout_at(past, std::future::pending::<()>()));
        assert_eq!(r, Err(Elapsed));
    }

    #[test]
    fn sleeps_in_sequence_each_wake() {
        let start = Instant::now();
        for i in 1..=3 {
            zbus::block_on(Sleep::until(start + Duration::from_millis(20 * i)));
        }
        assert!(start.elapsed() >= Duration::from_millis(60));
    }
}
