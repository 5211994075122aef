//! The shape of every writer task: a loop computes what an object should be and
//! hands it over as a wish ([`Wishes::want`]); the object's writer task makes the
//! writes, a few at a time, through [`super::writes`]. So a loop never
//! waits for its writes, and a slow or failing kind of write holds back no other.
//!
//! - The latest wish for an object wins: one asked for again before it is written
//!   is written once, as last asked.
//! - An object is never written twice at once: a wish for an object being written
//!   waits for that write to end, then goes first.
//! - Each writer starts its write from the object as the cache holds it then, and
//!   makes none when the object already is as wished (or is gone).
//! - An object whose write failed is handed back to its loop when the one retry
//!   policy says ([`Error::retry`]), and the loop computes it again from what
//!   holds then.

use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::hash::Hash;
use std::sync::{Arc, Mutex};

use futures::StreamExt;
use futures::stream::FuturesUnordered;
use kube::runtime::reflector::ObjectRef;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use super::error::{Error, Retry};
use crate::objects::DaemonSetObject;
use crate::placement::desired::DesiredNode;
use crate::policy::crd::PlacementPolicyStatus;

/// What a loop wants written and the writer has not finished; shared by the two.
#[derive(Debug)]
pub struct Wishes<K, W> {
    queue: Mutex<Queue<K, W>>,
    /// Told of every wish, so the writer takes it.
    asked: Notify,
}

#[derive(Debug)]
struct Queue<K, W> {
    /// Keys in the order first asked. A key may be here whose wish was taken back,
    /// or twice: the wish in `wanted` is what counts. A key being written leaves
    /// it until its write ends.
    order: VecDeque<K>,
    /// The latest wish for each object not yet being written.
    wanted: HashMap<K, W>,
    /// Objects being written, and what they are being brought to.
    writing: HashMap<K, W>,
}

impl<K, W> Default for Wishes<K, W> {
    fn default() -> Self {
        Wishes {
            queue: Mutex::new(Queue {
                order: VecDeque::new(),
                wanted: HashMap::new(),
                writing: HashMap::new(),
            }),
            asked: Notify::new(),
        }
    }
}

impl<K: Clone + Eq + Hash, W: Clone> Wishes<K, W> {
    /// Asks for `key` to be brought to `wish`, in place of anything asked for it
    /// before and not yet written.
    pub fn want(&self, key: K, wish: W) {
        let mut queue = locked(&self.queue);
        let queue = &mut *queue;
        if queue.wanted.insert(key.clone(), wish).is_none() {
            queue.order.push_back(key);
        }
        self.asked.notify_one();
    }

    /// Takes back any wish for `key` not yet being written: the object is as it
    /// should be, or is gone.
    pub fn settled(&self, key: &K) {
        locked(&self.queue).wanted.remove(key);
    }

    /// Whether any write being made brings its object to a state that `test`
    /// holds for. A wish not yet taken is left out: the pass that asks replaces
    /// it.
    pub fn writing_any(&self, test: impl Fn(&W) -> bool) -> bool {
        locked(&self.queue).writing.values().any(test)
    }

    /// Forgets every wish not yet being written (this replica lost the Lease, or
    /// stopped leading for good).
    pub fn clear(&self) {
        let mut queue = locked(&self.queue);
        queue.order.clear();
        queue.wanted.clear();
    }

    /// The next object to write and what to write, marked as being written.
    fn next(&self) -> Option<(K, W)> {
        let mut queue = locked(&self.queue);
        let queue = &mut *queue;
        while let Some(key) = queue.order.pop_front() {
            // An object being written comes back when its write ends.
            if queue.writing.contains_key(&key) {
                continue;
            }
            if let Some(wish) = queue.wanted.remove(&key) {
                queue.writing.insert(key.clone(), wish.clone());
                return Some((key, wish));
            }
        }
        None
    }

    /// The write to `key` ended; a wish that waited for it goes first.
    fn written(&self, key: &K) {
        let mut queue = locked(&self.queue);
        queue.writing.remove(key);
        if queue.wanted.contains_key(key) {
            queue.order.push_front(key.clone());
            self.asked.notify_one();
        }
    }
}

/// One kind of write: how an object is brought to a wish.
pub trait Writer: Send + 'static {
    type Key: Clone + Eq + Hash + Send + 'static;
    type Wish: Clone + Send + 'static;

    /// Writes of this kind in flight at once.
    const CONCURRENCY: usize;

    /// What this writer does, for the log of a failed write: "cannot {WHAT}".
    const WHAT: &'static str;

    /// The object `key` names, for the log.
    fn object(key: &Self::Key) -> String;

    /// The write that brings `key` to `wish`, from the object as the cache holds it
    /// now; `None` when there is nothing to write. The write logs and counts what
    /// it did; it ends `Ok` when nothing is left to write (what it found already
    /// done too), and an error is retried as [`Error::retry`] says.
    fn write(
        &self,
        key: &Self::Key,
        wish: Self::Wish,
    ) -> Option<impl Future<Output = Result<(), Error>> + Send + 'static>;
}

/// Writes what `wishes` asks until `shutdown`; hands each object whose write
/// failed, with the wish it was written for, to `retry` when [`Error::retry`]
/// says.
pub async fn run<T: Writer>(
    writer: T,
    wishes: Arc<Wishes<T::Key, T::Wish>>,
    retry: impl Fn(&T::Key, T::Wish),
    shutdown: CancellationToken,
) {
    let mut in_flight = FuturesUnordered::new();
    let mut failed: Vec<(tokio::time::Instant, T::Key, T::Wish)> = Vec::new();
    loop {
        while in_flight.len() < T::CONCURRENCY
            && let Some((key, wish)) = wishes.next()
        {
            match writer.write(&key, wish.clone()) {
                Some(write) => in_flight.push(async move { (key, wish, write.await) }),
                None => wishes.written(&key),
            }
        }
        let retry_at = failed.iter().map(|(at, _, _)| *at).min();
        tokio::select! {
            () = shutdown.cancelled() => break,
            Some((key, wish, result)) = in_flight.next(), if !in_flight.is_empty() => {
                wishes.written(&key);
                if let Err(error) = result {
                    let (then, object) = (error.retry(), T::object(&key));
                    match then {
                        Retry::Never => {
                            tracing::debug!(%object, %error, "cannot {}; {then}", T::WHAT);
                        }
                        Retry::After(delay) => {
                            tracing::warn!(%object, %error, "cannot {}; {then}", T::WHAT);
                            failed.push((tokio::time::Instant::now() + delay, key, wish));
                        }
                    }
                }
            }
            // With every write slot taken, a wish waits for a write to end.
            () = wishes.asked.notified(), if in_flight.len() < T::CONCURRENCY => {}
            () = until(retry_at) => {
                let now = tokio::time::Instant::now();
                let (due, later): (Vec<_>, Vec<_>) = std::mem::take(&mut failed)
                    .into_iter()
                    .partition(|(at, _, _)| *at <= now);
                failed = later;
                for (_, key, wish) in due {
                    retry(&key, wish);
                }
            }
        }
    }
}

// The wishes of each kind: what a loop and its writer agree on, below both.

/// What the nodes pass wants each node to carry, by name.
pub type NodeQueue = Wishes<String, DesiredNode>;

/// The part of a policy a wish is for: the two are written apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Part {
    Finalizer,
    Status,
}

/// What a policy should be.
#[derive(Debug, Clone, PartialEq)]
pub enum PolicyWish {
    /// Let the deleted policy go: its nodes are clean.
    RemoveFinalizer,
    Status(Box<PlacementPolicyStatus>),
}

impl PolicyWish {
    pub fn part(&self) -> Part {
        match self {
            PolicyWish::RemoveFinalizer => Part::Finalizer,
            PolicyWish::Status(_) => Part::Status,
        }
    }
}

/// What the nodes pass wants of each policy, by name and part.
pub type PolicyWrites = Wishes<(String, Part), PolicyWish>;

/// The DaemonSets the nodes pass found drifting. A wish carries nothing: the
/// writer works out the patch from what holds when it writes.
pub type DaemonSetWrites = Wishes<ObjectRef<DaemonSetObject>, ()>;

/// A PodGroup, by namespace and name.
pub type GroupKey = (String, String);

/// What a gang needs of its PodGroup: `minCount`, and the members' priority class.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupWish {
    pub min_count: u32,
    pub class: Option<String>,
}

/// What the releases loop wants of each gang's PodGroup, for the PodGroup writer.
pub type PodGroupWrites = Wishes<GroupKey, GroupWish>;

/// The queue PriorityClasses the nodes pass wants made, by name: each one's value.
pub type ClassWrites = Wishes<String, i32>;

/// An object berth made for groups and no longer needs.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Unused {
    /// A queue PriorityClass, by name.
    Class(String),
    /// A gang's PodGroup, by namespace and name.
    PodGroup(GroupKey),
}

/// What the sweep wants deleted, each object with the uid it was found with (a
/// namesake made since stays).
pub type SweepWrites = Wishes<Unused, Option<String>>;

/// The value behind `mutex`; a task that panicked holding it left a whole value.
pub fn locked<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

/// Sleeps until `deadline`; without one, forever.
pub async fn until(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controller::error::RETRY_FAILED;
    use std::time::Duration;

    /// Fails as each key says: "lost" as a replica without the Lease, "slow" with
    /// a timeout, "refused" with a 403; writes anything else.
    struct Failing;

    impl Writer for Failing {
        type Key = &'static str;
        type Wish = u32;
        const CONCURRENCY: usize = 4;
        const WHAT: &'static str = "fail";

        fn object(key: &&'static str) -> String {
            key.to_string()
        }

        fn write(
            &self,
            key: &&'static str,
            _: u32,
        ) -> Option<impl Future<Output = Result<(), Error>> + Send + 'static> {
            let result = match *key {
                "lost" => Err(Error::NotLeader),
                "slow" => Err(Error::Timeout(Duration::from_secs(10))),
                "refused" => Err(crate::controller::error::api_error(403).into()),
                _ => Ok(()),
            };
            Some(async move { result })
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_failed_write_is_handed_back_with_its_wish_when_the_policy_says() {
        let wishes = Arc::new(Wishes::default());
        let (retried, mut retries) = tokio::sync::mpsc::unbounded_channel();
        let shutdown = CancellationToken::new();
        let task = tokio::spawn(run(
            Failing,
            wishes.clone(),
            move |key: &&'static str, wish| retried.send((*key, wish)).unwrap(),
            shutdown.clone(),
        ));
        let started = tokio::time::Instant::now();
        for (key, wish) in [("lost", 1), ("slow", 2), ("written", 3), ("refused", 4)] {
            wishes.want(key, wish);
        }
        let mut back = vec![retries.recv().await.unwrap(), retries.recv().await.unwrap()];
        assert_eq!(
            started.elapsed(),
            RETRY_FAILED,
            "handed back after the wait"
        );
        back.sort();
        assert_eq!(back, [("refused", 4), ("slow", 2)]);
        tokio::time::sleep(RETRY_FAILED * 3).await;
        assert!(
            retries.try_recv().is_err(),
            "a write without the Lease, or one made, is not handed back"
        );
        shutdown.cancel();
        task.await.unwrap();
    }

    type Queue = Wishes<&'static str, &'static str>;

    #[test]
    fn the_latest_wish_is_written_and_an_object_is_never_written_twice_at_once() {
        let queue = Queue::default();
        queue.want("a", "one");
        queue.want("b", "b");
        queue.want("a", "two");
        assert_eq!(queue.next(), Some(("a", "two")), "once, as last asked");
        queue.want("a", "three");
        assert_eq!(
            queue.next(),
            Some(("b", "b")),
            "a's new wish waits for its write in flight"
        );
        assert!(queue.next().is_none());
        assert!(queue.writing_any(|w| *w == "two"));
        assert!(!queue.writing_any(|w| *w == "three"), "not taken");
        queue.written(&"a");
        assert_eq!(queue.next(), Some(("a", "three")));
        queue.written(&"a");
        queue.written(&"b");
        assert!(!queue.writing_any(|_| true));
        assert!(queue.next().is_none());
    }

    #[test]
    fn a_wish_taken_back_is_not_written() {
        let queue = Queue::default();
        queue.want("a", "one");
        queue.want("b", "one");
        queue.settled(&"a");
        assert_eq!(queue.next(), Some(("b", "one")));
        assert!(queue.next().is_none(), "a was taken back");
        // Taken back while it waits for its object's write to end: nothing follows
        // the write.
        queue.want("b", "two");
        assert!(queue.next().is_none(), "b's wish waits");
        queue.settled(&"b");
        queue.written(&"b");
        assert!(queue.next().is_none());
        // A replica that lost the Lease forgets what is asked, not what is being
        // written: no second write of c starts before the first ends.
        queue.want("c", "one");
        queue.next().unwrap();
        queue.want("d", "one");
        queue.clear();
        assert!(queue.next().is_none());
        assert!(queue.writing_any(|_| true), "c's write is still on its way");
    }
}
