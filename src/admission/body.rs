//! Reading request bodies within bounds: a size limit, a read timeout and a memory
//! budget shared by all requests in flight.
//!
//! A body over the limit, too slow, or arriving while the budget is spent is not
//! read whole; its first bytes are kept, so the handler can still find the
//! request's uid there and answer with a denial: a 4xx would count as a webhook
//! failure, and the apiserver would let the pod through (`failurePolicy: Ignore`).

use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes, HttpBody};
use http_body_util::BodyExt;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// How much of an unread body is kept to find the uid in.
const PREFIX: usize = 64 * 1024;
/// Bodies up to this size (most pods: a few kB) take nothing from the budget, so a
/// flood of large ones never makes an ordinary pod wait for room.
const SMALL: usize = 64 * 1024;
/// The budget is counted in KiB.
const UNIT: usize = 1024;
/// A body held in memory costs about this many times its size while it is
/// decided: the bytes, and the JSON read from them.
const COST: usize = 2;

/// The bounds every request body is read within.
#[derive(Debug, Clone)]
pub struct BodyLimits {
    /// Largest body read whole.
    pub max_bytes: usize,
    /// How long a body may take to arrive.
    pub read_timeout: Duration,
    /// How long a request waits for room in the budget.
    pub budget_wait: Duration,
    budget: Arc<Semaphore>,
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
        }
    }
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
    /// since the request's uid is there.
    pub async fn read(&self, body: Body) -> ReadBody {
        let mut bytes: Vec<u8> = Vec::new();
        let mut held: Option<OwnedSemaphorePermit> = None;
        let announced = HttpBody::size_hint(&body)
            .exact()
            .and_then(|n| usize::try_from(n).ok())
            .filter(|n| *n <= self.max_bytes);
        let read = tokio::time::timeout(self.read_timeout, async {
            let mut refused = None;
            if let Some(length) = announced {
                if self.reserve(&mut held, Self::units(length)).await {
                    bytes.reserve(length);
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
                        .reserve(&mut held, Self::units(bytes.len() + data.len()))
                        .await
                {
                    refused = Some(Unread::Busy);
                }
                if refused.is_some() {
                    // Keep what the prefix still has room for: the uid is there.
                    let room = PREFIX.saturating_sub(bytes.len()).min(data.len());
                    bytes.extend_from_slice(&data[..room]);
                    if bytes.len() >= PREFIX {
                        break;
                    }
                    continue;
                }
                bytes.extend_from_slice(&data);
            }
            Ok::<_, String>(refused)
        })
        .await;
        let prefix = |bytes: &[u8]| Bytes::copy_from_slice(&bytes[..bytes.len().min(PREFIX)]);
        match read {
            Ok(Ok(None)) => ReadBody::Whole(Bytes::from(bytes), held),
            Ok(Ok(Some(Unread::TooLarge))) => ReadBody::TooLarge(prefix(&bytes)),
            Ok(Ok(Some(Unread::Busy))) => ReadBody::Busy(prefix(&bytes)),
            Ok(Err(e)) => ReadBody::Incomplete(prefix(&bytes), e),
            Err(_) => ReadBody::Incomplete(
                prefix(&bytes),
                format!("the body did not arrive within {:?}", self.read_timeout),
            ),
        }
    }

    /// Budget units for `bytes` of body: none for a small body.
    fn units(bytes: usize) -> u32 {
        if bytes <= SMALL {
            return 0;
        }
        u32::try_from(bytes * COST / UNIT + 1).unwrap_or(u32::MAX)
    }

    /// Holds at least `units` of the budget, waiting at most `budget_wait` for more.
    async fn reserve(&self, held: &mut Option<OwnedSemaphorePermit>, units: u32) -> bool {
        let have = held.as_ref().map_or(0, |p| p.num_permits() as u32);
        if units <= have {
            return true;
        }
        let more = self.budget.clone().acquire_many_owned(units - have);
        match tokio::time::timeout(self.budget_wait, more).await {
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

    #[tokio::test]
    async fn bodies_are_read_within_the_limit_and_the_budget() {
        let limits = BodyLimits::new(200_000, 800_000, Duration::from_secs(5));
        let total = limits.budget.available_permits();
        let ReadBody::Whole(bytes, held) = limits.read(Body::from(vec![b'x'; 200_000])).await
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

        let ReadBody::TooLarge(prefix) = limits.read(Body::from(vec![b'x'; 200_001])).await else {
            panic!("a body over the limit is not read whole");
        };
        assert_eq!(prefix.len(), PREFIX, "its first bytes are kept");
    }

    #[tokio::test]
    async fn a_spent_budget_refuses_large_bodies_but_never_small_ones() {
        let mut limits = BodyLimits::new(200_000, 0, Duration::from_secs(5));
        limits.budget_wait = Duration::from_millis(50);
        let ReadBody::Whole(_, held) = limits.read(Body::from(vec![b'x'; 200_000])).await else {
            panic!("read");
        };
        // The first body holds the whole budget: the second cannot be read now, but
        // its first bytes are, to answer by its uid.
        let second = limits.read(Body::from(vec![b'y'; 100_000])).await;
        let ReadBody::Busy(prefix) = second else {
            panic!("{second:?}");
        };
        assert_eq!(prefix.len(), PREFIX);
        // An ordinary pod is never kept waiting by the large ones.
        let small = limits.read(Body::from(vec![b'z'; 6_000])).await;
        assert!(matches!(small, ReadBody::Whole(..)), "{small:?}");
        drop(held);
        let third = limits.read(Body::from(vec![b'y'; 100_000])).await;
        assert!(matches!(third, ReadBody::Whole(..)));
    }
}
