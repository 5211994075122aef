//! Reading request bodies within bounds: a size limit, a read timeout and a memory
//! budget shared fairly by the peers whose bodies are in flight ([`FairShare`]).
//!
//! A body is charged to the budget as its bytes arrive, never before: a client
//! that announces a large body and sends nothing holds nothing. A body over the
//! limit, too slow, or arriving while the budget has no room for its peer is not
//! read whole; its first bytes are kept, so the handler can still find the
//! request's uid there and answer with a denial: a 4xx would count as a webhook
//! failure, and the apiserver would let the pod through (`failurePolicy: Ignore`).
//! A body is never left half read to wait for room: its unread bytes would hold
//! the HTTP/2 connection's window, and the reviews behind it on that connection.

use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use axum::body::{Body, Bytes};
use http_body_util::BodyExt;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::share::{FairShare, Hold};

/// How much of an unread body is kept to find the uid in.
const PREFIX: usize = 64 * 1024;
/// A request whose body and its read cost up to this much (most pods: a few kB of
/// body, [`read_cost`](super::review::read_cost)) is charged to a share of the budget that
/// large requests never use, so a flood of large ones never makes an ordinary pod
/// wait for room; a costlier one is charged whole to the large share.
const FREE: usize = 1024 * 1024;
/// The least the small share holds: room for many ordinary requests at once,
/// whatever the budget.
const SMALL_LEAST: usize = 16 * FREE;
/// The budget is counted in KiB.
const UNIT: usize = 1024;
/// While a body arrives, it holds this many times its size: the bytes, and a first
/// share of what reading them holds. Once it is whole, it holds its
/// [`read_cost`](super::review::read_cost) ([`BodyLimits::charge`]).
const COST: usize = 2;
/// The part of the budget kept for the first [`FREE`] of each request's cost.
const SMALL_PART: usize = 4;

/// A body up to this size is read and decided on the async worker that received
/// it (well under a millisecond); a larger one on a thread for blocking work,
/// holding one of the CPU slots.
const INLINE: usize = 64 * 1024;

/// The bounds every request body is read and decided within.
#[derive(Debug, Clone)]
pub struct BodyLimits {
    /// Largest body read whole.
    pub max_bytes: usize,
    /// How long a body may take to arrive.
    pub read_timeout: Duration,
    /// How long a request read whole waits for room to read its JSON, at most:
    /// never past the time it must be answered by.
    pub budget_wait: Duration,
    /// What the first [`FREE`] of each request's cost is charged to, in units.
    small: Arc<FairShare>,
    /// What the rest is charged to, in units.
    large: Arc<FairShare>,
    /// One per core: large reviews are read and decided this many at a time, so
    /// that the answers already decided still get a core to go out on.
    cpu: Arc<Semaphore>,
}

impl BodyLimits {
    /// `budget_bytes` bounds the memory of all bodies being read and decided at
    /// once: a quarter for the first [`FREE`] of each, the rest for large ones.
    pub fn new(max_bytes: usize, budget_bytes: usize, read_timeout: Duration) -> Self {
        let small_units = (budget_bytes / SMALL_PART).max(SMALL_LEAST).div_ceil(UNIT);
        // A body at the limit must fit in the budget, or it could never be read.
        let large_units = (budget_bytes - budget_bytes / SMALL_PART)
            .max(max_bytes * COST)
            .div_ceil(UNIT);
        BodyLimits {
            max_bytes,
            read_timeout,
            budget_wait: Duration::from_secs(1),
            small: FairShare::new(small_units as u64),
            large: FairShare::new(large_units as u64),
            cpu: Arc::new(Semaphore::new(
                std::thread::available_parallelism().map_or(1, |n| n.get()),
            )),
        }
    }

    /// Whether a body of `length` bytes is read and decided at once, on the async
    /// worker, rather than in a CPU slot.
    pub fn is_small(length: usize) -> bool {
        length <= INLINE
    }

    /// The CPU slot in which a review of `length` bytes is read and decided, if
    /// one comes free by `answer_by`: a small review's (read and decided at once,
    /// on the async worker that received it) is always free; a large one holds one
    /// of the cores' slots from its charge to its decision.
    ///
    /// Holding the slot across the steps is what keeps a flood of large reviews
    /// answering: with a slot taken per step, each review would wait behind every
    /// later one's first step, and under more than the cores can do in time all of
    /// them would miss their deadline half done. One slot each, they are decided in
    /// the order they came, and those whose deadline passes in line are refused
    /// before any of their work is done.
    ///
    /// A review charges what reading it costs in its slot ([`BodyLimits::charge`]),
    /// and may wait there for the budget with its core idle. It keeps the core: no
    /// review is charged outside a slot, so the budget it waits for is freed only by
    /// another slot's end or by a queued body given up, and the reviews in line
    /// could do nothing before they too waited for it.
    pub async fn cpu_slot(&self, length: usize, answer_by: Instant) -> Option<CpuSlot> {
        let slot = if Self::is_small(length) {
            None
        } else {
            let slot = self.cpu.clone().acquire_owned();
            Some(Arc::new(
                tokio::time::timeout_at(answer_by, slot).await.ok()?.ok()?,
            ))
        };
        Some(CpuSlot { slot, answer_by })
    }
}

/// A review's CPU slot: its CPU work runs in it, answered by `answer_by`.
#[derive(Debug)]
pub struct CpuSlot {
    /// The CPU slot a large review holds; none for a small one. Shared with the
    /// work running in it, so that the slot is free again only once the
    /// review is answered and its work has ended.
    slot: Option<Arc<OwnedSemaphorePermit>>,
    answer_by: Instant,
}

impl CpuSlot {
    /// Runs `work`; its result if it ends by the slot's deadline. A small review's
    /// work (under a millisecond) runs at once; a large review's would stall every
    /// other request and `/healthz` with it on the async workers, so it runs on a
    /// thread for blocking work. Work that overruns the deadline is not waited
    /// for, but it keeps the core until it ends: a flood of reviews refused late
    /// never has more of them at work than there are cores.
    pub async fn run<T: Send + 'static>(
        &self,
        work: impl FnOnce() -> T + Send + 'static,
    ) -> Option<T> {
        let Some(slot) = self.slot.clone() else {
            return Some(work());
        };
        let work = move || {
            let _slot = slot;
            work()
        };
        tokio::time::timeout_at(self.answer_by, tokio::task::spawn_blocking(work))
            .await
            .ok()?
            .ok()
    }
}

/// A body's bytes as they arrive: the first frame kept as it came (most reviews
/// arrive in one, and need no copy), the bytes of later ones copied after it.
#[derive(Default)]
struct Arrived {
    first: Option<Bytes>,
    copied: Vec<u8>,
}

impl Arrived {
    fn len(&self) -> usize {
        self.first.as_ref().map_or(0, Bytes::len) + self.copied.len()
    }

    fn push(&mut self, data: Bytes) {
        if self.first.is_none() && self.copied.is_empty() {
            self.first = Some(data);
            return;
        }
        if let Some(first) = self.first.take() {
            self.copied.reserve(first.len() + data.len());
            self.copied.extend_from_slice(&first);
        }
        self.copied.extend_from_slice(&data);
    }

    fn into_bytes(self) -> Bytes {
        // The first frame is kept only while it is all there is.
        self.first.unwrap_or_else(|| Bytes::from(self.copied))
    }
}

/// What one request holds of the budget: its cost in the small share while it is
/// at most [`FREE`], in the large share once it is more. Given back when dropped.
#[derive(Debug)]
pub struct Held {
    small: Hold,
    large: Hold,
    /// Units held in each, as this request counts them.
    small_units: u64,
    large_units: u64,
}

impl Held {
    /// Units of the small and the large share for a cost of `bytes`.
    fn units(bytes: usize) -> (u64, u64) {
        let units = bytes.div_ceil(UNIT) as u64;
        if bytes <= FREE {
            (units, 0)
        } else {
            (0, units)
        }
    }

    /// Holds at least a cost of `bytes`, at once or not at all; waiting until
    /// `until` for the large share to have room when given.
    async fn cover_until(&mut self, bytes: usize, until: Option<Instant>) -> bool {
        let (small, large) = Self::units(bytes);
        if small > self.small_units {
            if !self.small.grow(small - self.small_units) {
                return false;
            }
            self.small_units = small;
        }
        if large > self.large_units {
            let more = large - self.large_units;
            let grown = match until {
                None => self.large.grow(more),
                Some(until) => self.large.grow_within(more, until).await,
            };
            if !grown {
                return false;
            }
            self.large_units = large;
            // Now held whole in the large share: the small one is for small ones.
            self.small.release();
            self.small_units = 0;
        }
        !self.is_revoked()
    }

    /// Holds at least a cost of `bytes`, at once or not at all.
    fn cover(&mut self, bytes: usize) -> bool {
        // Without a time to wait until, nothing awaits: the future is ready at once.
        futures::FutureExt::now_or_never(self.cover_until(bytes, None)).unwrap_or(false)
    }

    fn is_revoked(&self) -> bool {
        self.small.is_revoked() || self.large.is_revoked()
    }

    /// Resolves once a peer holding less took this request's share.
    async fn revoked(&self) {
        tokio::select! {
            () = self.small.revoked() => {}
            () = self.large.revoked() => {}
        }
    }
}

/// Whether a request holds the budget it needs.
#[derive(Debug, PartialEq, Eq)]
pub enum Charge {
    /// It does.
    Held,
    /// Other requests hold the budget, and did for the whole wait.
    Busy,
    /// It needs `cost` bytes, more than the whole budget, `most` bytes.
    Never { cost: usize, most: usize },
}

/// A body as read.
#[derive(Debug)]
pub enum ReadBody {
    /// Read whole; the budget it holds is given back when this is dropped.
    Whole(Bytes, Held),
    /// Larger than the limit: its first bytes.
    TooLarge(Bytes),
    /// The budget had no room for it: its first bytes.
    Busy(Bytes),
    /// It did not arrive in time, or the connection failed: its first bytes.
    Incomplete(Bytes, String),
}

impl BodyLimits {
    /// Reads the body `peer` sends within the bounds, charging the budget as its
    /// bytes arrive (never for bytes announced and not sent).
    ///
    /// Refused or not, the first bytes are read, since the request's uid is there.
    /// It reads no later than `answer_by`, and gives up as soon as the budget has
    /// no room for the peer, or a peer holding less takes its share.
    pub async fn read(&self, body: Body, peer: IpAddr, answer_by: Instant) -> ReadBody {
        let mut bytes = Arrived::default();
        let mut held = Held {
            small: self.small.hold_none(peer),
            large: self.large.hold_none(peer),
            small_units: 0,
            large_units: 0,
        };
        let until = answer_by.min(Instant::now() + self.read_timeout);
        let read = tokio::time::timeout_at(until, async {
            let mut refused = None;
            let mut body = body;
            loop {
                let frame = tokio::select! {
                    frame = body.frame() => frame,
                    // Given to a peer holding less: what arrived is all it keeps.
                    () = held.revoked(), if refused.is_none() => {
                        refused = Some(Unread::Busy);
                        break;
                    }
                };
                let Some(frame) = frame else { break };
                let frame = frame.map_err(|e| e.to_string())?;
                let Ok(data) = frame.into_data() else {
                    continue;
                };
                let length = bytes.len() + data.len();
                if refused.is_none() && length > self.max_bytes {
                    refused = Some(Unread::TooLarge);
                }
                if refused.is_none() && !held.cover(length.saturating_mul(COST)) {
                    refused = Some(Unread::Busy);
                }
                if refused.is_some() {
                    // Keep what the prefix still has room for: the uid is there.
                    let room = PREFIX.saturating_sub(bytes.len()).min(data.len());
                    bytes.push(data.slice(..room));
                    if bytes.len() >= PREFIX {
                        break;
                    }
                    continue;
                }
                bytes.push(data);
            }
            Ok::<_, String>(refused)
        })
        .await;
        let bytes = bytes.into_bytes();
        let prefix = |bytes: &Bytes| bytes.slice(..bytes.len().min(PREFIX));
        match read {
            Ok(Ok(None)) => ReadBody::Whole(bytes, held),
            Ok(Ok(Some(Unread::TooLarge))) => ReadBody::TooLarge(prefix(&bytes)),
            Ok(Ok(Some(Unread::Busy))) => ReadBody::Busy(prefix(&bytes)),
            Ok(Err(e)) => ReadBody::Incomplete(prefix(&bytes), e),
            Err(_) => ReadBody::Incomplete(
                prefix(&bytes),
                "the body did not arrive in time".to_string(),
            ),
        }
    }

    /// Holds `cost` bytes of the budget for a body read whole (what reading it holds
    /// at most, its bytes included: [`read_cost`](super::review::read_cost)),
    /// waiting at most `budget_wait`, and not past `answer_by`, for room. The body
    /// is whole by then, so waiting holds no connection's window.
    pub async fn charge(&self, held: &mut Held, cost: usize, answer_by: Instant) -> Charge {
        let (_, large) = Held::units(cost);
        if large > self.large.capacity() {
            return Charge::Never {
                cost,
                most: self.large.capacity() as usize * UNIT,
            };
        }
        let until = answer_by.min(Instant::now() + self.budget_wait);
        if held.cover_until(cost, Some(until)).await {
            Charge::Held
        } else {
            Charge::Busy
        }
    }
}

enum Unread {
    TooLarge,
    Busy,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A time to answer by that no test reaches.
    fn later() -> Instant {
        Instant::now() + Duration::from_secs(60)
    }

    fn peer(last: u8) -> IpAddr {
        IpAddr::from([127, 0, 0, last])
    }

    /// A body whose frames the test sends when it likes.
    fn channel() -> (tokio::sync::mpsc::Sender<Bytes>, Body) {
        let (sender, receiver) = tokio::sync::mpsc::channel(8);
        let frames = futures::stream::unfold(receiver, |mut receiver| async move {
            let data = receiver.recv().await?;
            Some((Ok::<_, std::convert::Infallible>(data), receiver))
        });
        (sender, Body::from_stream(frames))
    }

    /// Units held in both shares.
    fn used(limits: &BodyLimits) -> u64 {
        limits.small.used() + limits.large.used()
    }

    #[tokio::test]
    async fn bodies_are_read_within_the_limit_and_the_budget() {
        let limits = BodyLimits::new(200_000, 800_000, Duration::from_secs(5));
        let ReadBody::Whole(bytes, held) = limits
            .read(Body::from(vec![b'x'; 200_000]), peer(1), later())
            .await
        else {
            panic!("a body at the limit is read");
        };
        assert_eq!(bytes.len(), 200_000);
        assert!(used(&limits) >= 400_000 / UNIT as u64, "charged as it came");
        drop(held);
        assert_eq!(used(&limits), 0, "the budget comes back");

        let ReadBody::TooLarge(prefix) = limits
            .read(Body::from(vec![b'x'; 200_001]), peer(1), later())
            .await
        else {
            panic!("a body over the limit is not read whole");
        };
        assert_eq!(prefix.len(), PREFIX, "its first bytes are kept");
    }

    #[tokio::test]
    async fn a_body_is_read_whole_in_order_and_one_frame_is_not_copied() {
        let limits = BodyLimits::new(200_000, 800_000, Duration::from_secs(5));
        let frames = |parts: &[&'static [u8]]| {
            let parts: Vec<Result<Bytes, std::convert::Infallible>> =
                parts.iter().map(|p| Ok(Bytes::from_static(p))).collect();
            Body::from_stream(futures::stream::iter(parts))
        };
        let ReadBody::Whole(bytes, _) = limits
            .read(frames(&[b"ab", b"", b"cd", b"e"]), peer(1), later())
            .await
        else {
            panic!("read whole");
        };
        assert_eq!(&bytes[..], b"abcde");
        let one: &'static [u8] = b"{\"kind\":\"AdmissionReview\"}";
        let ReadBody::Whole(bytes, _) = limits.read(frames(&[one]), peer(1), later()).await else {
            panic!("read whole");
        };
        assert_eq!(bytes.as_ptr(), one.as_ptr(), "kept as it came");
    }

    #[tokio::test]
    async fn a_spent_budget_refuses_large_bodies_but_never_small_ones() {
        let mut limits = BodyLimits::new(1_000_000, 0, Duration::from_secs(5));
        limits.budget_wait = Duration::from_millis(50);
        let ReadBody::Whole(_, held) = limits
            .read(Body::from(vec![b'x'; 1_000_000]), peer(1), later())
            .await
        else {
            panic!("read");
        };
        // The first body holds the whole large share: the second cannot be read
        // now, and is given up at once rather than left half read, but its first
        // bytes are kept, to answer by its uid.
        let second = limits
            .read(Body::from(vec![b'y'; 600_000]), peer(1), later())
            .await;
        let ReadBody::Busy(prefix) = second else {
            panic!("the second body is read while the budget is spent");
        };
        assert_eq!(prefix.len(), PREFIX);
        // An ordinary pod, and what reading it costs, never wait for the large ones.
        let small = limits
            .read(Body::from(vec![b'z'; 6_000]), peer(1), later())
            .await;
        let ReadBody::Whole(_, mut free) = small else {
            panic!("an ordinary pod waits");
        };
        assert_eq!(
            limits.charge(&mut free, 40_000, later()).await,
            Charge::Held
        );
        // What reading a body costs is charged once it is whole: more than is left
        // waits and is refused as busy, more than there is at all is refused.
        assert_eq!(
            limits.charge(&mut free, FREE + 300_000, later()).await,
            Charge::Busy
        );
        assert!(matches!(
            limits.charge(&mut free, 10 << 20, later()).await,
            Charge::Never { .. }
        ));
        drop(held);
        assert_eq!(
            limits.charge(&mut free, FREE + 300_000, later()).await,
            Charge::Held
        );
        drop(free);
        let third = limits
            .read(Body::from(vec![b'y'; 600_000]), peer(1), later())
            .await;
        assert!(matches!(third, ReadBody::Whole(..)));
    }

    /// String content is charged by its length only, whatever bytes it holds: a
    /// review of strings up to the body limit (19 MiB) is read within the default
    /// budget (128 MiB), commas, quotes and escapes included.
    #[tokio::test]
    async fn a_review_of_strings_up_to_the_limit_is_read_within_the_default_budget() {
        use crate::admission::review::{items, read_cost};
        let limits = BodyLimits::new(19 << 20, 128 << 20, Duration::from_secs(5));
        let review = |value: &str| {
            format!(
                r#"{{"kind":"AdmissionReview","request":{{"object":{{"spec":{{"containers":
                [{{"env":[{{"name":"X","value":"{value}"}}]}}]}}}}}}}}"#
            )
        };
        let plain = review("x");
        for content in [",", r#"\""#, r#"\u003c"#, "[{"] {
            let body = review(&content.repeat(((19 << 20) - plain.len()) / content.len()));
            assert!(body.len() <= 19 << 20);
            assert_eq!(items(body.as_bytes()), items(plain.as_bytes()), "{content}");
            let read = limits
                .read(Body::from(body.clone()), peer(1), later())
                .await;
            let ReadBody::Whole(_, mut held) = read else {
                panic!("{content}: not read whole");
            };
            let cost = read_cost(body.as_bytes());
            assert_eq!(limits.charge(&mut held, cost, later()).await, Charge::Held);
        }
    }

    #[tokio::test]
    async fn a_body_announced_and_not_sent_holds_nothing() {
        let limits = BodyLimits::new(19 << 20, 0, Duration::from_secs(5));
        let (sender, body) = channel();
        sender.send(Bytes::from_static(b"{")).await.unwrap();
        let reading = tokio::spawn({
            let limits = limits.clone();
            async move {
                limits
                    .read(body, peer(2), Instant::now() + Duration::from_millis(300))
                    .await
            }
        });
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(
            used(&limits),
            1,
            "one byte arrived: one unit held, not 19 MiB"
        );
        let ReadBody::Incomplete(prefix, why) = reading.await.unwrap() else {
            panic!("never sent");
        };
        assert_eq!(&prefix[..], b"{");
        assert!(why.contains("in time"), "{why}");
        drop(sender);
        assert_eq!(used(&limits), 0);
    }

    #[tokio::test]
    async fn a_peer_holding_less_takes_the_budget_from_a_body_still_arriving() {
        let limits = BodyLimits::new(2_000_000, 0, Duration::from_secs(5));
        // Another peer's body has taken the whole large share and sends no more.
        let (sender, body) = channel();
        sender
            .send(Bytes::from(vec![b'x'; 2_000_000]))
            .await
            .unwrap();
        let slow = tokio::spawn({
            let limits = limits.clone();
            async move { limits.read(body, peer(2), later()).await }
        });
        while limits.large.used() == 0 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        // The apiserver's large review, from a peer that holds nothing, takes its
        // equal share: the slow body is refused as busy, not the review.
        let review = limits
            .read(Body::from(vec![b'y'; 600_000]), peer(1), later())
            .await;
        assert!(
            matches!(review, ReadBody::Whole(..)),
            "the review was refused"
        );
        assert!(matches!(slow.await.unwrap(), ReadBody::Busy(_)));
        drop(sender);
    }

    #[tokio::test(start_paused = true)]
    async fn a_large_review_keeps_its_core_from_its_first_step_to_its_decision() {
        let mut limits = BodyLimits::new(400_000, 0, Duration::from_secs(5));
        limits.cpu = Arc::new(Semaphore::new(1));
        let large = INLINE + 1;
        let first = limits.cpu_slot(large, later()).await.expect("a free core");
        assert_eq!(first.run(|| 1).await, Some(1), "its read");
        // A later review finds the core taken between the first one's steps, and
        // waits until its own deadline, no longer.
        let answer_by = Instant::now() + Duration::from_millis(100);
        assert!(limits.cpu_slot(large, answer_by).await.is_none());
        assert_eq!(Instant::now(), answer_by);
        assert_eq!(first.run(|| 2).await, Some(2), "its decision");
        // A small review is read and decided at once, whoever holds the cores.
        let small = limits.cpu_slot(INLINE, later()).await.expect("no wait");
        assert_eq!(small.run(|| 3).await, Some(3));
        drop(first);
        assert!(
            limits.cpu_slot(large, later()).await.is_some(),
            "the core is free"
        );
    }

    #[tokio::test]
    async fn work_that_overruns_its_deadline_keeps_its_core_until_it_ends() {
        let mut limits = BodyLimits::new(400_000, 0, Duration::from_secs(5));
        limits.cpu = Arc::new(Semaphore::new(1));
        let answer_by = Instant::now() + Duration::from_millis(20);
        let slot = limits
            .cpu_slot(INLINE + 1, answer_by)
            .await
            .expect("a core");
        let (finish, finished) = std::sync::mpsc::channel::<()>();
        let overrun = slot.run(move || finished.recv().is_ok()).await;
        assert_eq!(
            overrun, None,
            "the review is not kept waiting past its deadline"
        );
        drop(slot);
        assert_eq!(limits.cpu.available_permits(), 0, "its work still runs");
        finish.send(()).unwrap();
        let next = limits.cpu_slot(INLINE + 1, later()).await;
        assert!(next.is_some(), "the core is free once the work has ended");
    }
}
