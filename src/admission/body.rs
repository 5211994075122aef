//! Reading request bodies within bounds: a size limit, a read timeout and a memory
//! budget shared by all requests in flight.
//!
//! A body over the limit, too slow, or arriving while the budget is spent is not
//! read whole; its first bytes are kept, so the handler can still find the
//! request's uid there and answer with a denial: a 4xx would count as a webhook
//! failure, and the apiserver would let the pod through (`failurePolicy: Ignore`).

use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use http_body_util::BodyExt;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// How much of an unread body is kept to find the uid in.
const PREFIX: usize = 64 * 1024;
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
    budget_units: usize,
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
            budget_units,
        }
    }

    /// Bytes of the budget in use now.
    pub fn budget_in_use(&self) -> usize {
        (self.budget_units - self.budget.available_permits()) * UNIT
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
    pub async fn read(&self, body: Body) -> ReadBody {
        let mut bytes: Vec<u8> = Vec::new();
        let mut held: Option<OwnedSemaphorePermit> = None;
        let read = tokio::time::timeout(self.read_timeout, async {
            let mut body = body;
            while let Some(frame) = body.frame().await {
                let frame = frame.map_err(|e| e.to_string())?;
                let Ok(data) = frame.into_data() else {
                    continue;
                };
                if bytes.len() + data.len() > self.max_bytes {
                    // Keep what the prefix still has room for: the uid is there.
                    let room = PREFIX.saturating_sub(bytes.len()).min(data.len());
                    bytes.extend_from_slice(&data[..room]);
                    return Ok(Some(Unread::TooLarge));
                }
                let units =
                    u32::try_from((bytes.len() + data.len()) * COST / UNIT + 1).unwrap_or(u32::MAX);
                let have = held.as_ref().map_or(0, |p| p.num_permits() as u32);
                if units > have {
                    let more = self.budget.clone().acquire_many_owned(units - have);
                    match tokio::time::timeout(self.budget_wait, more).await {
                        Ok(Ok(permit)) => match held.as_mut() {
                            Some(h) => h.merge(permit),
                            None => held = Some(permit),
                        },
                        _ => {
                            let room = PREFIX.saturating_sub(bytes.len()).min(data.len());
                            bytes.extend_from_slice(&data[..room]);
                            return Ok(Some(Unread::Busy));
                        }
                    }
                }
                bytes.extend_from_slice(&data);
            }
            Ok::<_, String>(None)
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
        let limits = BodyLimits::new(1000, 4000, Duration::from_secs(5));
        let ReadBody::Whole(bytes, held) = limits.read(Body::from(vec![b'x'; 1000])).await else {
            panic!("a body at the limit is read");
        };
        assert_eq!(bytes.len(), 1000);
        assert!(limits.budget_in_use() >= 2000);
        drop(held);
        assert_eq!(limits.budget_in_use(), 0, "the budget comes back");

        let ReadBody::TooLarge(prefix) = limits.read(Body::from(vec![b'x'; 1001])).await else {
            panic!("a body over the limit is not read whole");
        };
        assert_eq!(prefix.len(), 1001, "its first bytes are kept");
    }

    #[tokio::test]
    async fn a_spent_budget_refuses_instead_of_waiting_for_ever() {
        let mut limits = BodyLimits::new(100_000, 0, Duration::from_secs(5));
        limits.budget_wait = Duration::from_millis(50);
        let ReadBody::Whole(_, held) = limits.read(Body::from(vec![b'x'; 100_000])).await else {
            panic!("read");
        };
        // The first body holds the whole budget: the second cannot be read now.
        let second = limits.read(Body::from(vec![b'y'; 60_000])).await;
        assert!(matches!(second, ReadBody::Busy(_)), "{second:?}");
        drop(held);
        let third = limits.read(Body::from(vec![b'y'; 60_000])).await;
        assert!(matches!(third, ReadBody::Whole(..)));
    }
}
