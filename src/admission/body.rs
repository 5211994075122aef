//! Reading request bodies within bounds: a size limit, a read timeout and a memory
//! budget shared by all requests in flight.
//!
//! A body over the limit, too slow, or arriving while the budget is spent is not
//! read whole; its first bytes are kept, so the handler can still find the
//! request's uid there and answer with a denial: a 4xx would count as a webhook
//! failure, and the apiserver would let the pod through (`failurePolicy: Ignore`).

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use axum::body::{Body, Bytes, HttpBody};
use http_body_util::BodyExt;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// How much of an unread body is kept to find the uid in.
const PREFIX: usize = 64 * 1024;
/// A request whose body and JSON together cost up to this much (most pods: a few
/// kB of body, some tens of kB read) takes nothing from the budget, so a flood of
/// large ones never makes an ordinary pod wait for room. At most `--max-in-flight`
/// of them are decided at once.
const FREE: usize = 256 * 1024;
/// The budget is counted in KiB.
const UNIT: usize = 1024;
/// While a body arrives, it holds this many times its size: the bytes, and a first
/// share of the JSON read from them. Once it is whole, it holds what reading it
/// costs ([`BodyLimits::charge`]).
const COST: usize = 2;

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
    /// How long a request waits for room in the budget, at most: never past the
    /// time it must be answered by.
    pub budget_wait: Duration,
    budget: Arc<Semaphore>,
    /// The whole budget, in units.
    total_units: usize,
    /// One per core: large reviews are read and decided this many at a time, so
    /// that the answers already decided still get a core to go out on.
    cpu: Arc<Semaphore>,
}

impl BodyLimits {
    /// `budget_bytes` bounds the memory of all bodies being decided at once.
    pub fn new(max_bytes: usize, budget_bytes: usize, read_timeout: Duration) -> Self {
        // A body at the limit must fit in the budget, or it could never be read.
        let budget_units = budget_bytes.max(max_bytes * COST).div_ceil(UNIT);
        BodyLimits {
            max_bytes,
            read_timeout,
            budget_wait: Duration::from_secs(1),
            budget: Arc::new(Semaphore::new(budget_units)),
            total_units: budget_units,
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

    /// What reading a body of `length` bytes may build and still take nothing from
    /// the budget (see [`super::review::read_within`]).
    pub fn free_allowance(length: usize) -> usize {
        FREE.saturating_sub(length)
    }

    /// The turn on a core in which a review of `length` bytes is read and decided,
    /// if one comes free by `answer_by`: a small review's (read and decided at
    /// once, on the async worker that received it) is always free; a large one
    /// holds one of the CPU slots from its first walk to its decision.
    ///
    /// Holding the slot across the steps is what keeps a flood of large reviews
    /// answering: with a slot taken per step, each review would wait behind every
    /// later one's first step, and under more than the cores can do in time all of
    /// them would miss their deadline half done. One turn each, they are decided in
    /// the order they came, and those whose deadline passes in line are refused
    /// before any of their work is done.
    ///
    /// A review charges what reading it costs in its turn ([`BodyLimits::charge`]),
    /// and may wait there for the budget with its core idle. It keeps the core: no
    /// review is charged outside a turn, so the budget it waits for is freed only by
    /// another turn's end or by a queued body given up, and the reviews in line
    /// could do no more than their own cost walk before they too waited for it.
    pub async fn cpu_turn(&self, length: usize, answer_by: Instant) -> Option<CpuTurn> {
        let slot = if Self::is_small(length) {
            None
        } else {
            let slot = self.cpu.clone().acquire_owned();
            Some(Arc::new(
                tokio::time::timeout_at(answer_by, slot).await.ok()?.ok()?,
            ))
        };
        Some(CpuTurn { slot, answer_by })
    }
}

/// A review's turn on a core: its CPU work runs in it, answered by `answer_by`.
#[derive(Debug)]
pub struct CpuTurn {
    /// The CPU slot a large review holds; none for a small one. Shared with the
    /// work running in the turn, so that the slot is free again only once the
    /// review is answered and its work has ended.
    slot: Option<Arc<OwnedSemaphorePermit>>,
    answer_by: Instant,
}

impl CpuTurn {
    /// Runs `work`; its result if it ends by the turn's deadline. A small review's
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
    /// The length the body announced, if it did: room made at once once it
    /// needs copying.
    expected: usize,
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
            self.copied
                .reserve(self.expected.max(first.len() + data.len()));
            self.copied.extend_from_slice(&first);
        }
        self.copied.extend_from_slice(&data);
    }

    fn into_bytes(self) -> Bytes {
        // The first frame is kept only while it is all there is.
        self.first.unwrap_or_else(|| Bytes::from(self.copied))
    }
}

/// Whether a request holds the budget it needs.
#[derive(Debug, PartialEq, Eq)]
pub enum Charge {
    /// It does.
    Held,
    /// Other requests hold the budget, and did for the whole wait.
    Busy,
    /// It needs more than the whole budget, which is this many bytes.
    Never(usize),
}

/// A body as read.
#[derive(Debug)]
pub enum ReadBody {
    /// Read whole; the budget it holds is given back when this is dropped.
    Whole(Bytes, Option<OwnedSemaphorePermit>),
    /// Larger than the limit: its first bytes.
    TooLarge(Bytes),
    /// The budget stayed spent by other requests: its first bytes.
    Busy(Bytes),
    /// It did not arrive in time, or the connection failed: its first bytes.
    Incomplete(Bytes, String),
}

impl BodyLimits {
    /// Reads `body` within the bounds.
    ///
    /// A body whose length is announced takes its whole share of the budget before
    /// it is read: taken piece by piece, many large bodies could each hold part of
    /// the budget and wait on one another. Refused or not, the first bytes are read,
    /// since the request's uid is there. It reads and waits for room no later than
    /// `answer_by`.
    pub async fn read(&self, body: Body, answer_by: Instant) -> ReadBody {
        let mut bytes = Arrived::default();
        let mut held: Option<OwnedSemaphorePermit> = None;
        let announced = HttpBody::size_hint(&body)
            .exact()
            .and_then(|n| usize::try_from(n).ok())
            .filter(|n| *n <= self.max_bytes);
        let until = answer_by.min(Instant::now() + self.read_timeout);
        let read = tokio::time::timeout_at(until, async {
            let mut refused = None;
            if let Some(length) = announced {
                if self
                    .reserve(&mut held, Self::units(length), answer_by)
                    .await
                {
                    bytes.expected = length;
                } else {
                    refused = Some(Unread::Busy);
                }
            }
            let mut body = body;
            while let Some(frame) = body.frame().await {
                let frame = frame.map_err(|e| e.to_string())?;
                let Ok(data) = frame.into_data() else {
                    continue;
                };
                if refused.is_none() && bytes.len() + data.len() > self.max_bytes {
                    refused = Some(Unread::TooLarge);
                }
                if refused.is_none()
                    && announced.is_none()
                    && !self
                        .reserve(&mut held, Self::units(bytes.len() + data.len()), answer_by)
                        .await
                {
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

    /// The first bytes of `body` (where the uid is), read until `until` at most,
    /// for a review refused before it is read.
    pub async fn prefix(body: Body, until: Instant) -> Bytes {
        let mut bytes: Vec<u8> = Vec::new();
        let _ = tokio::time::timeout_at(until, async {
            let mut body = body;
            while bytes.len() < PREFIX {
                let Some(Ok(frame)) = body.frame().await else {
                    break;
                };
                if let Ok(data) = frame.into_data() {
                    let room = PREFIX.saturating_sub(bytes.len()).min(data.len());
                    bytes.extend_from_slice(&data[..room]);
                }
            }
        })
        .await;
        Bytes::from(bytes)
    }

    /// Budget units for `bytes` of body as it arrives.
    fn units(bytes: usize) -> u32 {
        Self::units_of_cost(bytes.saturating_mul(COST))
    }

    /// Budget units for a cost of `bytes`: none for a small one.
    fn units_of_cost(bytes: usize) -> u32 {
        if bytes <= FREE {
            return 0;
        }
        u32::try_from(bytes / UNIT + 1).unwrap_or(u32::MAX)
    }

    /// Holds at least `cost` bytes of the budget for a body read whole (its bytes and
    /// what reading it costs, [`super::cost::parse_cost`]), waiting at most
    /// `budget_wait`, and not past `answer_by`, for room.
    pub async fn charge(
        &self,
        held: &mut Option<OwnedSemaphorePermit>,
        cost: usize,
        answer_by: Instant,
    ) -> Charge {
        let units = Self::units_of_cost(cost);
        if units as usize > self.total_units {
            return Charge::Never(self.total_units * UNIT);
        }
        if self.reserve(held, units, answer_by).await {
            Charge::Held
        } else {
            Charge::Busy
        }
    }

    /// Holds at least `units` of the budget, waiting at most `budget_wait`, and not
    /// past `answer_by`, for more.
    async fn reserve(
        &self,
        held: &mut Option<OwnedSemaphorePermit>,
        units: u32,
        answer_by: Instant,
    ) -> bool {
        let have = held.as_ref().map_or(0, |p| p.num_permits() as u32);
        if units <= have {
            return true;
        }
        let more = self.budget.clone().acquire_many_owned(units - have);
        let until = answer_by.min(Instant::now() + self.budget_wait);
        match tokio::time::timeout_at(until, more).await {
            Ok(Ok(permit)) => {
                match held.as_mut() {
                    Some(h) => h.merge(permit),
                    None => *held = Some(permit),
                }
                true
            }
            _ => false,
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

    #[tokio::test]
    async fn bodies_are_read_within_the_limit_and_the_budget() {
        let limits = BodyLimits::new(200_000, 800_000, Duration::from_secs(5));
        let total = limits.budget.available_permits();
        let ReadBody::Whole(bytes, held) =
            limits.read(Body::from(vec![b'x'; 200_000]), later()).await
        else {
            panic!("a body at the limit is read");
        };
        assert_eq!(bytes.len(), 200_000);
        assert!(total - limits.budget.available_permits() >= 400_000 / UNIT);
        drop(held);
        assert_eq!(
            limits.budget.available_permits(),
            total,
            "the budget comes back"
        );

        let ReadBody::TooLarge(prefix) =
            limits.read(Body::from(vec![b'x'; 200_001]), later()).await
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
            .read(frames(&[b"ab", b"", b"cd", b"e"]), later())
            .await
        else {
            panic!("read whole");
        };
        assert_eq!(&bytes[..], b"abcde");
        let one: &'static [u8] = b"{\"kind\":\"AdmissionReview\"}";
        let ReadBody::Whole(bytes, _) = limits.read(frames(&[one]), later()).await else {
            panic!("read whole");
        };
        assert_eq!(bytes.as_ptr(), one.as_ptr(), "kept as it came");
    }

    #[tokio::test]
    async fn a_spent_budget_refuses_large_bodies_but_never_small_ones() {
        let mut limits = BodyLimits::new(400_000, 0, Duration::from_secs(5));
        limits.budget_wait = Duration::from_millis(50);
        let budget = 800_000usize.div_ceil(UNIT) * UNIT;
        let ReadBody::Whole(_, held) = limits.read(Body::from(vec![b'x'; 400_000]), later()).await
        else {
            panic!("read");
        };
        // The first body holds the whole budget: the second cannot be read now, but
        // its first bytes are, to answer by its uid.
        let second = limits.read(Body::from(vec![b'y'; 200_000]), later()).await;
        let ReadBody::Busy(prefix) = second else {
            panic!("the second body is read while the budget is spent");
        };
        assert_eq!(prefix.len(), PREFIX);
        // An ordinary pod, and what reading it costs, never wait for the large ones.
        let small = limits.read(Body::from(vec![b'z'; 6_000]), later()).await;
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
            limits.charge(&mut free, 300_000, later()).await,
            Charge::Busy
        );
        assert_eq!(
            limits.charge(&mut free, 10 << 20, later()).await,
            Charge::Never(budget)
        );
        drop(held);
        assert_eq!(
            limits.charge(&mut free, 300_000, later()).await,
            Charge::Held
        );
        drop(free);
        let third = limits.read(Body::from(vec![b'y'; 200_000]), later()).await;
        assert!(matches!(third, ReadBody::Whole(..)));
    }

    #[tokio::test(start_paused = true)]
    async fn a_request_waits_for_room_no_later_than_it_must_be_answered() {
        let limits = BodyLimits::new(400_000, 0, Duration::from_secs(5));
        let ReadBody::Whole(_, _held) = limits.read(Body::from(vec![b'x'; 400_000]), later()).await
        else {
            panic!("read");
        };
        let started = Instant::now();
        let answer_by = started + Duration::from_millis(100);
        let second = limits
            .read(Body::from(vec![b'y'; 200_000]), answer_by)
            .await;
        assert!(matches!(second, ReadBody::Busy(_)));
        assert_eq!(
            started.elapsed(),
            Duration::from_millis(100),
            "it waits until then, not its budget_wait of 5 s"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_large_review_keeps_its_core_from_its_first_step_to_its_decision() {
        let mut limits = BodyLimits::new(400_000, 0, Duration::from_secs(5));
        limits.cpu = Arc::new(Semaphore::new(1));
        let large = INLINE + 1;
        let first = limits.cpu_turn(large, later()).await.expect("a free core");
        assert_eq!(first.run(|| 1).await, Some(1), "its walk");
        // A later review finds the core taken between the first one's steps, and
        // waits until its own deadline, no longer.
        let answer_by = Instant::now() + Duration::from_millis(100);
        assert!(limits.cpu_turn(large, answer_by).await.is_none());
        assert_eq!(Instant::now(), answer_by);
        assert_eq!(first.run(|| 2).await, Some(2), "its decision");
        // A small review is read and decided at once, whoever holds the cores.
        let small = limits.cpu_turn(INLINE, later()).await.expect("no wait");
        assert_eq!(small.run(|| 3).await, Some(3));
        drop(first);
        assert!(
            limits.cpu_turn(large, later()).await.is_some(),
            "the core is free"
        );
    }

    #[tokio::test]
    async fn work_that_overruns_its_deadline_keeps_its_core_until_it_ends() {
        let mut limits = BodyLimits::new(400_000, 0, Duration::from_secs(5));
        limits.cpu = Arc::new(Semaphore::new(1));
        let answer_by = Instant::now() + Duration::from_millis(20);
        let turn = limits
            .cpu_turn(INLINE + 1, answer_by)
            .await
            .expect("a core");
        let (finish, finished) = std::sync::mpsc::channel::<()>();
        let overrun = turn.run(move || finished.recv().is_ok()).await;
        assert_eq!(
            overrun, None,
            "the review is not kept waiting past its deadline"
        );
        drop(turn);
        assert_eq!(limits.cpu.available_permits(), 0, "its work still runs");
        finish.send(()).unwrap();
        let next = limits.cpu_turn(INLINE + 1, later()).await;
        assert!(next.is_some(), "the core is free once the work has ended");
    }
}
