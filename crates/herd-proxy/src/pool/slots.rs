//! A pool's slots and idle items, with a queue of waiters that are handed a slot directly.
//!
//! A pool of `size` slots hands each lease one. When a lease ends, its slot and (when the
//! connection is sound) its connection go straight to the oldest waiter, as PgBouncer hands a
//! released server to a waiting client; only with nobody waiting do they go back to the free
//! count and the idle list. This replaces a semaphore plus a timer per wait: a wait costs a
//! queue entry, and the waits' time limits are kept by one task per pool that runs only while
//! someone waits, waking at the earliest deadline or once a second, not once per waiter.
//!
//! Invariant: while a live waiter is queued there is no free slot (a freed slot goes to the
//! waiter), so a lease taken without waiting never jumps the queue.

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use tokio::time::Instant;

/// The longest the janitor sleeps: a wait runs out within this of its deadline.
const JANITOR_TICK: Duration = Duration::from_secs(1);

/// The slots of one pool; `T` is what a slot may come with (a server connection).
pub struct Slots<T> {
    inner: Mutex<Inner<T>>,
}

struct Inner<T> {
    /// Items kept for reuse, the most recently returned last.
    idle: Vec<T>,
    /// Slots nobody holds.
    free: usize,
    /// Waiters, oldest first (entries whose waiter left are skipped and dropped).
    waiters: VecDeque<Arc<Waiter<T>>>,
    /// Whether the task that times waiters out is running.
    janitor: bool,
}

/// One waiting lease.
struct Waiter<T> {
    state: Mutex<State<T>>,
    deadline: Instant,
}

enum State<T> {
    /// Queued; the waker of the task that waits.
    Waiting(Option<Waker>),
    /// Handed a slot, with an item when one came with it.
    Granted(Option<T>),
    /// Its time ran out.
    TimedOut,
    /// It has taken its grant or given up.
    Gone,
}

/// A wait that ran out of time.
#[derive(Debug, PartialEq, Eq)]
pub struct TimedOut;

/// Locks `m`, recovering from poisoning (the guarded data stay consistent: every critical
/// section below completes its changes before anything can panic).
fn lock<S>(m: &Mutex<S>) -> MutexGuard<'_, S> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl<T: Send + 'static> Slots<T> {
    /// `size` free slots, nothing idle.
    pub fn new(size: usize) -> Self {
        Slots {
            inner: Mutex::new(Inner {
                idle: Vec::new(),
                free: size,
                waiters: VecDeque::new(),
                janitor: false,
            }),
        }
    }

    /// A free slot with the most recent idle item, when both are there now.
    pub fn try_take_idle(&self) -> Option<T> {
        let mut g = lock(&self.inner);
        if g.free == 0 {
            return None;
        }
        let item = g.idle.pop()?;
        g.free -= 1;
        Some(item)
    }

    /// Another idle item for a slot already held (the first one taken was unusable).
    pub fn pop_idle(&self) -> Option<T> {
        lock(&self.inner).idle.pop()
    }

    /// Whether every slot is held now (a new lease would wait).
    pub fn is_full(&self) -> bool {
        lock(&self.inner).free == 0
    }

    /// Idle items now.
    pub fn idle_len(&self) -> usize {
        lock(&self.inner).idle.len()
    }

    /// Drops every idle item.
    pub fn clear_idle(&self) {
        let dropped = std::mem::take(&mut lock(&self.inner).idle);
        drop(dropped); // outside the lock: dropping a connection closes its socket
    }

    /// Gives a held slot back, with `item` when it may be reused: to the oldest waiter, or
    /// else to the free count and the idle list.
    pub fn give_back(&self, item: Option<T>) {
        let mut g = lock(&self.inner);
        while let Some(w) = g.waiters.pop_front() {
            let mut s = lock(&w.state);
            if let State::Waiting(waker) = &mut *s {
                let waker = waker.take();
                *s = State::Granted(item);
                drop(s);
                drop(g);
                if let Some(waker) = waker {
                    waker.wake();
                }
                return;
            }
        }
        g.free += 1;
        if let Some(item) = item {
            g.idle.push(item);
        }
    }

    /// A slot, with the most recent idle item when there is one: at once when a slot is free,
    /// else the first one given back, waiting at most `wait` (in order of arrival).
    pub async fn take(self: &Arc<Self>, wait: Duration) -> Result<Option<T>, TimedOut> {
        let waiter = {
            let mut g = lock(&self.inner);
            if g.free > 0 {
                g.free -= 1;
                return Ok(g.idle.pop());
            }
            let waiter = Arc::new(Waiter {
                state: Mutex::new(State::Waiting(None)),
                deadline: Instant::now() + wait,
            });
            g.waiters.push_back(waiter.clone());
            if !g.janitor {
                g.janitor = true;
                tokio::spawn(janitor(self.clone()));
            }
            waiter
        };
        Wait {
            slots: self,
            waiter,
            done: false,
        }
        .await
    }
}

/// Times out the waiters whose deadline passed; runs while anyone waits.
async fn janitor<T: Send + 'static>(slots: Arc<Slots<T>>) {
    loop {
        let next = {
            let mut g = lock(&slots.inner);
            let now = Instant::now();
            g.waiters.retain(|w| {
                let mut s = lock(&w.state);
                match &mut *s {
                    State::Waiting(_) if w.deadline > now => true,
                    State::Waiting(waker) => {
                        let waker = waker.take();
                        *s = State::TimedOut;
                        if let Some(waker) = waker {
                            waker.wake();
                        }
                        false
                    }
                    _ => false,
                }
            });
            match g.waiters.iter().map(|w| w.deadline).min() {
                Some(next) => next,
                None => {
                    g.janitor = false;
                    return;
                }
            }
        };
        // At most a tick: a later waiter may have an earlier deadline than the ones seen.
        tokio::time::sleep_until(next.min(Instant::now() + JANITOR_TICK)).await;
    }
}

/// The wait of [`Slots::take`]. Dropped before it finished (its task gave up), it leaves the
/// queue, and a slot already handed to it goes on to the next waiter.
struct Wait<'a, T: Send + 'static> {
    slots: &'a Arc<Slots<T>>,
    waiter: Arc<Waiter<T>>,
    done: bool,
}

impl<T: Send + 'static> Future for Wait<'_, T> {
    type Output = Result<Option<T>, TimedOut>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        // Wait holds no pinned data: a plain `&mut` is sound.
        let this = self.get_mut();
        let mut s = lock(&this.waiter.state);
        match std::mem::replace(&mut *s, State::Gone) {
            State::Waiting(waker) => {
                let waker = match waker {
                    Some(w) if w.will_wake(cx.waker()) => w,
                    _ => cx.waker().clone(),
                };
                *s = State::Waiting(Some(waker));
                Poll::Pending
            }
            State::Granted(item) => {
                this.done = true;
                Poll::Ready(Ok(item))
            }
            State::TimedOut | State::Gone => {
                this.done = true;
                Poll::Ready(Err(TimedOut))
            }
        }
    }
}

impl<T: Send + 'static> Drop for Wait<'_, T> {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        let was = std::mem::replace(&mut *lock(&self.waiter.state), State::Gone);
        if let State::Granted(item) = was {
            // Handed a slot it will not use: the next waiter (or the pool) gets it.
            self.slots.give_back(item);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LONG: Duration = Duration::from_secs(30);

    #[tokio::test(flavor = "current_thread")]
    async fn free_slots_first_then_waiters_in_order_of_arrival() {
        let slots = Arc::new(Slots::<u32>::new(1));
        assert!(slots.try_take_idle().is_none(), "nothing idle yet");
        assert_eq!(slots.take(LONG).await, Ok(None), "a free slot, no item");
        assert!(slots.is_full());
        let (a, b) = (slots.clone(), slots.clone());
        let first = tokio::spawn(async move { a.take(LONG).await });
        tokio::task::yield_now().await;
        let second = tokio::spawn(async move { b.take(LONG).await });
        tokio::task::yield_now().await;
        slots.give_back(Some(7));
        assert_eq!(
            first.await.expect("the task ran"),
            Ok(Some(7)),
            "the oldest waiter, with the item"
        );
        assert!(
            slots.is_full(),
            "the slot went to the waiter, not back to the pool"
        );
        slots.give_back(None); // e.g. a connection closed instead of released
        assert_eq!(
            second.await.expect("the task ran"),
            Ok(None),
            "an empty slot: it opens a connection"
        );
        slots.give_back(Some(8));
        assert!(!slots.is_full());
        assert_eq!(slots.idle_len(), 1);
        assert_eq!(slots.try_take_idle(), Some(8));
        slots.give_back(Some(8));
        slots.clear_idle();
        assert_eq!(slots.idle_len(), 0);
        assert!(
            !slots.is_full(),
            "clearing the idle items frees no slot twice"
        );
        assert_eq!(slots.take(LONG).await, Ok(None));
        assert!(slots.is_full());
    }

    #[tokio::test(flavor = "current_thread", start_paused = true)]
    async fn a_wait_runs_out_at_its_deadline() {
        let slots = Arc::new(Slots::<u32>::new(1));
        let _held = slots.take(LONG).await;
        let started = Instant::now();
        let got = slots.take(Duration::from_secs(3)).await;
        assert_eq!(got, Err(TimedOut));
        let waited = started.elapsed();
        assert!(
            waited >= Duration::from_secs(3) && waited < Duration::from_secs(4),
            "{waited:?}"
        );
        // A later waiter with a shorter limit runs out at its own deadline (within the
        // janitor's tick), not at the earlier waiter's.
        let b = slots.clone();
        let long = tokio::spawn(async move { b.take(LONG).await });
        tokio::task::yield_now().await;
        let started = Instant::now();
        assert_eq!(slots.take(Duration::from_secs(2)).await, Err(TimedOut));
        let waited = started.elapsed();
        assert!(
            waited >= Duration::from_secs(2) && waited <= Duration::from_secs(3),
            "{waited:?}"
        );
        slots.give_back(Some(2));
        assert_eq!(
            long.await.expect("the task ran"),
            Ok(Some(2)),
            "the long waiter still waited"
        );
        // Nobody waits now: the slot given back is free again.
        slots.give_back(Some(1));
        assert_eq!(slots.try_take_idle(), Some(1));
    }

    #[tokio::test(flavor = "current_thread", start_paused = true)]
    async fn an_abandoned_wait_passes_its_slot_on() {
        let slots = Arc::new(Slots::<u32>::new(1));
        let _held = slots.take(LONG).await;
        let a = slots.clone();
        // Gives up before being served: its queue entry is skipped.
        let gave_up = tokio::spawn(async move {
            tokio::time::timeout(Duration::from_secs(1), a.take(LONG)).await
        });
        let b = slots.clone();
        let served = tokio::spawn(async move { b.take(LONG).await });
        assert!(
            gave_up.await.expect("the task ran").is_err(),
            "its own limit ran out first"
        );
        slots.give_back(Some(5));
        assert_eq!(served.await.expect("the task ran"), Ok(Some(5)));

        // Granted but dropped before it ran: the grant goes to the next waiter.
        let c = slots.clone();
        let granted_then_dropped = tokio::spawn(async move { c.take(LONG).await });
        tokio::task::yield_now().await;
        let d = slots.clone();
        let next = tokio::spawn(async move { d.take(LONG).await });
        tokio::task::yield_now().await;
        slots.give_back(Some(6));
        granted_then_dropped.abort();
        assert!(granted_then_dropped.await.is_err(), "aborted");
        assert_eq!(next.await.expect("the task ran"), Ok(Some(6)));
    }
}
