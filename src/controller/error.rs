//! The controller's errors, and the one retry policy every write follows.
//!
//! Every write goes through [`super::writes::Writes::make`] and ends in
//! `Result<_, Error>`. What happens after a failed write is decided here, in
//! [`Error::retry`], for every writer task and both loops alike:
//!
//! - **Which errors retry**: all but [`Error::NotLeader`]. A replica that lost the
//!   Lease writes nothing more; the next leader computes everything anew. A
//!   conflict (409) or an object gone (404) is retried too: the write is computed
//!   again from the cache, which then holds the new version or no object (and
//!   then nothing is written), because the watch of a change berth does not read
//!   (a node's heartbeat, berth's own status write) wakes no loop. What a writer
//!   knows to be done (a PriorityClass that exists, a delete of an object already
//!   gone) it answers `Ok` before this policy is asked.
//! - **How long to wait**: [`RETRY_FAILED`], then the object goes back to the loop
//!   that wanted it, which computes it again from what holds then. A failed write
//!   is never sent again as it was.
//! - **How often**: until it lands, or the loop wants something else of the
//!   object: the rate limits of [`super::writes`] bound the load, and the failure
//!   rate alert (`berth_controller_writes_total`) reports a kind that keeps
//!   failing. Only the node writer writes again at once, on a conflict, from the
//!   node it reads afresh, at most [`CONFLICT_RETRIES`] times: a node's status
//!   changes often, and a pool's taint should not wait for it.

use std::fmt;
use std::time::Duration;

/// How long after a failed write what it was for is looked at again (a quiet
/// cluster might otherwise wait for the resync).
pub const RETRY_FAILED: Duration = Duration::from_secs(5);

/// How often a write made from an object read afresh is made again at once after
/// a conflict, before it waits [`RETRY_FAILED`] like any other.
pub const CONFLICT_RETRIES: usize = 5;

/// Why a controller write was not made, or failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// This replica does not hold the Lease: the write was not sent.
    #[error("this replica does not hold the Lease")]
    NotLeader,
    /// The apiserver did not answer in time; the write may or may not have landed.
    #[error("the apiserver did not answer within {0:?}")]
    Timeout(Duration),
    /// The apiserver refused the write (its status and message), or could not be
    /// reached.
    #[error(transparent)]
    Kube(#[from] kube::Error),
}

/// What comes after a failed write, by [`Error::retry`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Retry {
    /// Nothing: this replica does not lead.
    Never,
    /// The loop that wanted the write computes it again after this long.
    After(Duration),
}

impl fmt::Display for Retry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Retry::Never => f.write_str("not retried"),
            Retry::After(delay) => write!(f, "retrying in {delay:?}"),
        }
    }
}

impl Error {
    /// The HTTP status the apiserver answered with, if it answered.
    pub fn status(&self) -> Option<u16> {
        match self {
            Error::Kube(kube::Error::Api(status)) => Some(status.code),
            _ => None,
        }
    }

    /// Whether the apiserver refused the write as made from an older version of
    /// the object (409).
    pub fn is_conflict(&self) -> bool {
        self.status() == Some(409)
    }

    /// The `outcome` label of a write that ended so.
    pub fn outcome(&self) -> &'static str {
        match (self, self.status()) {
            (Error::NotLeader, _) => "not_leader",
            (Error::Timeout(_), _) => "timeout",
            (_, Some(409)) => "conflict",
            (_, Some(404)) => "not_found",
            (_, Some(429)) => "too_many_requests",
            _ => "error",
        }
    }

    /// What comes after this failure: the one retry policy (see the module).
    pub fn retry(&self) -> Retry {
        match self {
            Error::NotLeader => Retry::Never,
            Error::Timeout(_) | Error::Kube(_) => Retry::After(RETRY_FAILED),
        }
    }
}

#[cfg(test)]
pub(crate) fn api_error(code: u16) -> kube::Error {
    kube::Error::Api(
        kube::core::Status::failure("no", "Reason")
            .with_code(code)
            .boxed(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_failure_but_a_lost_lease_is_retried_after_five_seconds() {
        assert_eq!(RETRY_FAILED, Duration::from_secs(5));
        assert_eq!(Error::NotLeader.retry(), Retry::Never);
        let timeout = Error::Timeout(Duration::from_secs(10));
        assert_eq!(timeout.retry(), Retry::After(RETRY_FAILED));
        // Refused, stale, gone, throttled (an eviction a PodDisruptionBudget
        // forbids for now), broken: each is computed again later.
        for code in [400, 403, 404, 409, 422, 429, 500, 503] {
            let error = Error::from(api_error(code));
            assert_eq!(error.retry(), Retry::After(RETRY_FAILED), "{code}");
        }
        let unreachable = Error::from(kube::Error::TlsRequired);
        assert_eq!(unreachable.retry(), Retry::After(RETRY_FAILED));
        assert_eq!(CONFLICT_RETRIES, 5);
    }

    #[test]
    fn outcomes_and_messages_name_what_went_wrong() {
        assert!(Error::from(api_error(409)).is_conflict());
        assert!(!Error::from(api_error(404)).is_conflict());
        let outcomes: Vec<&str> = [409, 404, 429, 500]
            .into_iter()
            .map(|code| Error::from(api_error(code)).outcome())
            .collect();
        assert_eq!(
            outcomes,
            ["conflict", "not_found", "too_many_requests", "error"]
        );
        assert_eq!(Error::NotLeader.outcome(), "not_leader");
        let timeout = Error::Timeout(Duration::from_secs(10));
        assert_eq!(timeout.outcome(), "timeout");
        assert_eq!(
            timeout.to_string(),
            "the apiserver did not answer within 10s"
        );
        assert_eq!(
            Error::NotLeader.to_string(),
            "this replica does not hold the Lease"
        );
        assert_eq!(Retry::After(RETRY_FAILED).to_string(), "retrying in 5s");
        assert_eq!(Retry::Never.to_string(), "not retried");
    }
}
