//! The controller's write rate: each kind of write goes through a token bucket of
//! its own ([`super::writes`]), so that a large change cannot flood the apiserver.

use std::time::Duration;

/// A token bucket for one kind of write: `per_second` on average, with
/// bursts of up to two seconds' worth, so that a new pool over a thousand nodes is
/// written in seconds while a steady trickle stays at the rate.
pub struct RateLimit {
    per_second: f64,
    burst: f64,
    bucket: tokio::sync::Mutex<(f64, tokio::time::Instant)>,
}

impl RateLimit {
    pub fn new(per_second: u32) -> Self {
        let per_second = f64::from(per_second.max(1));
        let burst = 2.0 * per_second;
        RateLimit {
            per_second,
            burst,
            bucket: tokio::sync::Mutex::new((burst, tokio::time::Instant::now())),
        }
    }

    /// Takes one token, waiting for it if the bucket is empty. Waiters queue on
    /// the lock, so they are served in turn.
    pub async fn acquire(&self) {
        let mut bucket = self.bucket.lock().await;
        let now = tokio::time::Instant::now();
        let (tokens, last) = *bucket;
        let mut tokens =
            (tokens + now.duration_since(last).as_secs_f64() * self.per_second).min(self.burst);
        let mut at = now;
        if tokens < 1.0 {
            let wait = Duration::from_secs_f64((1.0 - tokens) / self.per_second);
            tokio::time::sleep(wait).await;
            at = now + wait;
            tokens = 1.0;
        }
        *bucket = (tokens - 1.0, at);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn writes_go_in_a_burst_then_at_the_rate() {
        let limit = RateLimit::new(10);
        let start = tokio::time::Instant::now();
        for _ in 0..20 {
            limit.acquire().await;
        }
        assert_eq!(
            start.elapsed(),
            Duration::ZERO,
            "a burst of two seconds' worth"
        );
        for _ in 0..10 {
            limit.acquire().await;
        }
        let elapsed = start.elapsed().as_secs_f64();
        assert!((elapsed - 1.0).abs() < 1e-3, "then 10 a second: {elapsed}");
    }
}
