//! Capacity shared fairly among the peers (client addresses) that use it: the
//! webhook's connections, and the memory of the request bodies it receives.
//!
//! Whoever reaches berth's port can use both, so one client must not be able to
//! take them from the apiserver. While there is room, anyone takes what it needs.
//! When there is none, a peer holding less than an equal share (the capacity over
//! the number of peers holding some, itself included) takes it from the peer
//! holding the most, whose newest holdings are revoked: their owners see it and
//! give up (a connection is closed, a body being read is refused as busy). A peer
//! at its equal share gets nothing more, and a peer holding nothing may always
//! take one unit, however many peers hold some. So a client on one address has
//! what nobody else needs, and the apiserver keeps at least an equal share however
//! many connections or bodies come from elsewhere, and from however many
//! addresses.
//!
//! A holding can be protected ([`Hold::protect`]): no peer takes it. berth
//! protects the connections of clients its door trusts (the apiserver's), which
//! then count against no share: otherwise a tenant with more addresses than there
//! are connections could take the apiserver's, one new address at a time.
//!
//! A peer is an IPv4 address, or an IPv6 /64: a host is given a whole /64 and can
//! take as many of its addresses as it likes.

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::sync::{CancellationToken, WaitForCancellationFuture};

/// The peer an address belongs to: the address itself for IPv4 (an IPv4-mapped
/// IPv6 address included), its /64 for IPv6.
fn peer_of(addr: IpAddr) -> IpAddr {
    match addr.to_canonical() {
        IpAddr::V6(v6) => {
            let bits = u128::from(v6) & !((1u128 << 64) - 1);
            IpAddr::V6(bits.into())
        }
        v4 => v4,
    }
}

/// A capacity, in units of the caller's choosing, shared among peers.
#[derive(Debug)]
pub struct FairShare {
    capacity: u64,
    state: Mutex<State>,
    /// Woken whenever units are given back, for [`Hold::grow_within`].
    released: Notify,
}

#[derive(Debug, Default)]
struct State {
    used: u64,
    /// Numbers holdings in the order they were taken: a peer's newest goes first.
    next: u64,
    peers: HashMap<IpAddr, Peer>,
}

#[derive(Debug, Default)]
struct Peer {
    used: u64,
    /// Of `used`, the units of holdings that are not protected: the peer's share.
    revocable: u64,
    holdings: BTreeMap<u64, Holding>,
}

impl Peer {
    /// The number of the newest holding others may take.
    fn newest_revocable(&self) -> Option<u64> {
        self.holdings
            .iter()
            .rev()
            .find(|(_, h)| !h.protected)
            .map(|(&id, _)| id)
    }
}

#[derive(Debug)]
struct Holding {
    amount: u64,
    revoked: CancellationToken,
    protected: bool,
}

/// Units one peer holds, given back when dropped (or when revoked for a peer that
/// holds less than its share).
#[derive(Debug)]
pub struct Hold {
    share: Arc<FairShare>,
    peer: IpAddr,
    id: u64,
    revoked: CancellationToken,
}

impl FairShare {
    pub fn new(capacity: u64) -> Arc<FairShare> {
        Arc::new(FairShare {
            capacity,
            state: Mutex::new(State::default()),
            released: Notify::new(),
        })
    }

    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    /// Units held now, by all peers.
    pub fn used(&self) -> u64 {
        self.lock().used
    }

    /// Takes `amount` units for `peer`, if there is room or the peer may take it
    /// from another; `None` otherwise.
    pub fn take(self: &Arc<Self>, peer: IpAddr, amount: u64) -> Option<Hold> {
        let peer = peer_of(peer);
        let mut state = self.lock();
        if !self.make_room(&mut state, peer, amount) {
            return None;
        }
        Some(self.insert(&mut state, peer, amount))
    }

    /// A holding of no units for `peer`, to grow ([`Hold::grow`]).
    pub fn hold_none(self: &Arc<Self>, peer: IpAddr) -> Hold {
        let peer = peer_of(peer);
        let mut state = self.lock();
        self.insert(&mut state, peer, 0)
    }

    fn insert(self: &Arc<Self>, state: &mut State, peer: IpAddr, amount: u64) -> Hold {
        let id = state.next;
        state.next += 1;
        let revoked = CancellationToken::new();
        state.used += amount;
        let mine = state.peers.entry(peer).or_default();
        mine.used += amount;
        mine.revocable += amount;
        mine.holdings.insert(
            id,
            Holding {
                amount,
                revoked: revoked.clone(),
                protected: false,
            },
        );
        Hold {
            share: self.clone(),
            peer,
            id,
            revoked,
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic elsewhere while holding the lock leaves the counts as they were
        // between two whole updates: still usable.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether `peer` may add `more` units, revoking other peers' newest holdings
    /// if it must and may.
    fn make_room(&self, state: &mut State, peer: IpAddr, more: u64) -> bool {
        if state.used.saturating_add(more) <= self.capacity {
            return true;
        }
        let mine = state.peers.get(&peer).map_or(0, |p| p.revocable);
        let holders =
            state.peers.values().filter(|p| p.revocable > 0).count() as u64 + u64::from(mine == 0);
        // At least one unit: with more peers than units, an equal share rounds
        // down to nothing, and a peer holding nothing could never get in.
        let equal = (self.capacity / holders.max(1)).max(1);
        if mine.saturating_add(more) > equal {
            return false;
        }
        let missing = state.used.saturating_add(more) - self.capacity;
        let others: u64 = state
            .peers
            .iter()
            .filter(|(p, _)| **p != peer)
            .map(|(_, held)| held.revocable)
            .sum();
        if others < missing {
            return false; // protected holdings fill the rest
        }
        while state.used.saturating_add(more) > self.capacity {
            // The peer holding the most; among equals, the one whose newest
            // holding is the oldest, so a newcomer's (the apiserver's handshake
            // among many addresses holding one each) is taken last.
            let Some((victim, id)) = state
                .peers
                .iter()
                .filter(|(p, held)| **p != peer && held.revocable > 0)
                .filter_map(|(p, held)| Some((*p, held.revocable, held.newest_revocable()?)))
                .max_by_key(|&(_, revocable, id)| (revocable, std::cmp::Reverse(id)))
                .map(|(p, _, id)| (p, id))
            else {
                return false;
            };
            let Some(held) = state.peers.get_mut(&victim) else {
                return false;
            };
            let Some(newest) = held.holdings.remove(&id) else {
                return false;
            };
            held.used -= newest.amount;
            held.revocable -= newest.amount;
            if held.holdings.is_empty() {
                state.peers.remove(&victim);
            }
            state.used -= newest.amount;
            newest.revoked.cancel();
        }
        true
    }
}

impl Hold {
    /// Adds `more` units to this holding, if there is room or the peer may take
    /// it; `false` (and nothing added) otherwise, or once the holding is revoked.
    pub fn grow(&mut self, more: u64) -> bool {
        if more == 0 {
            return !self.is_revoked();
        }
        let share = self.share.clone();
        let mut state = share.lock();
        if self.is_revoked() || !share.make_room(&mut state, self.peer, more) {
            return false;
        }
        // Making room never revokes the peer's own holdings.
        let Some(mine) = state.peers.get_mut(&self.peer) else {
            return false;
        };
        let Some(holding) = mine.holdings.get_mut(&self.id) else {
            return false;
        };
        holding.amount += more;
        if !holding.protected {
            mine.revocable += more;
        }
        mine.used += more;
        state.used += more;
        true
    }

    /// Makes this holding one no peer may take, and that counts against no
    /// share: for a client berth trusts. Nothing, once revoked.
    pub fn protect(&self) {
        let mut state = self.share.lock();
        let Some(mine) = state.peers.get_mut(&self.peer) else {
            return;
        };
        let Some(holding) = mine.holdings.get_mut(&self.id) else {
            return;
        };
        if !std::mem::replace(&mut holding.protected, true) {
            mine.revocable -= holding.amount;
        }
    }

    /// [`Hold::grow`], waiting until `until` for units to be given back.
    pub async fn grow_within(&mut self, more: u64, until: Instant) -> bool {
        let share = self.share.clone();
        loop {
            let released = share.released.notified();
            tokio::pin!(released);
            // Registered before the attempt, so a release in between is not missed.
            released.as_mut().enable();
            if self.grow(more) {
                return true;
            }
            if self.is_revoked() {
                return false;
            }
            tokio::select! {
                () = &mut released => {}
                () = tokio::time::sleep_until(until) => return false,
                () = self.revoked.cancelled() => return false,
            }
        }
    }

    /// Units this holding has (none once revoked).
    pub fn amount(&self) -> u64 {
        let state = self.share.lock();
        state
            .peers
            .get(&self.peer)
            .and_then(|p| p.holdings.get(&self.id))
            .map_or(0, |h| h.amount)
    }

    pub fn is_revoked(&self) -> bool {
        self.revoked.is_cancelled()
    }

    /// Gives back every unit of this holding, keeping it (empty) to grow again.
    pub fn release(&mut self) {
        let mut state = self.share.lock();
        let Some(mine) = state.peers.get_mut(&self.peer) else {
            return;
        };
        let Some(holding) = mine.holdings.get_mut(&self.id) else {
            return;
        };
        let amount = std::mem::take(&mut holding.amount);
        if !holding.protected {
            mine.revocable -= amount;
        }
        mine.used -= amount;
        state.used -= amount;
        drop(state);
        if amount > 0 {
            self.share.released.notify_waiters();
        }
    }

    /// Resolves once the holding is revoked for a peer that holds less.
    pub fn revoked(&self) -> WaitForCancellationFuture<'_> {
        self.revoked.cancelled()
    }
}

impl Drop for Hold {
    fn drop(&mut self) {
        let mut state = self.share.lock();
        let Some(mine) = state.peers.get_mut(&self.peer) else {
            return;
        };
        let Some(holding) = mine.holdings.remove(&self.id) else {
            return; // revoked: already given back
        };
        if !holding.protected {
            mine.revocable -= holding.amount;
        }
        mine.used -= holding.amount;
        if mine.holdings.is_empty() {
            state.peers.remove(&self.peer);
        }
        state.used -= holding.amount;
        drop(state);
        if holding.amount > 0 {
            self.share.released.notify_waiters();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn peer(last: u8) -> IpAddr {
        IpAddr::from([127, 0, 0, last])
    }

    #[test]
    fn anyone_takes_what_is_free_and_nothing_more_once_at_an_equal_share() {
        let share = FairShare::new(10);
        let attacker: Vec<Hold> = (0..10).map(|_| share.take(peer(2), 1).unwrap()).collect();
        assert_eq!(share.used(), 10, "alone, a peer may take everything");
        assert!(share.take(peer(2), 1).is_none(), "but not more");
        // The apiserver holds nothing, less than an equal share (5): it takes from
        // the peer holding the most, whose newest holding is revoked.
        let apiserver = share.take(peer(1), 1).expect("an equal share");
        assert!(attacker[9].is_revoked(), "the newest gives way");
        assert!(attacker[..9].iter().all(|h| !h.is_revoked()));
        assert_eq!(share.used(), 10);
        let more: Vec<Hold> = (0..4).map(|_| share.take(peer(1), 1).unwrap()).collect();
        assert_eq!(
            attacker.iter().filter(|h| h.is_revoked()).count(),
            5,
            "down to its equal share"
        );
        assert!(share.take(peer(1), 1).is_none(), "the apiserver at 5 of 10");
        assert!(share.take(peer(2), 1).is_none(), "so is the other peer");
        drop((apiserver, more));
        assert_eq!(share.used(), 5);
        drop(attacker);
        assert_eq!(share.used(), 0, "revoked holdings are not given back twice");
    }

    #[test]
    fn many_peers_cannot_take_the_apiserver_below_an_equal_share() {
        let share = FairShare::new(100);
        let mut held = Vec::new();
        for last in 10..30 {
            while let Some(hold) = share.take(peer(last), 1) {
                held.push(hold);
            }
        }
        assert_eq!(share.used(), 100);
        // 21 peers: an equal share is 4 units.
        let apiserver: Vec<Hold> = (0..4).map(|_| share.take(peer(1), 1).unwrap()).collect();
        assert!(share.take(peer(1), 1).is_none());
        assert!(apiserver.iter().all(|h| !h.is_revoked()));
        assert_eq!(share.used(), 100);
    }

    #[test]
    fn a_holding_grows_within_the_share_and_stops_growing_once_revoked() {
        let share = FairShare::new(100);
        let mut body = share.hold_none(peer(2));
        assert!(body.grow(60));
        assert!(body.grow(40));
        assert!(!body.grow(1), "full, and the only peer");
        let mut other = share.hold_none(peer(1));
        assert!(other.grow(30), "taken from the peer holding the most");
        assert!(body.is_revoked());
        assert_eq!(body.amount(), 0);
        assert!(!body.grow(1), "a revoked holding is refused");
        assert_eq!(share.used(), 30);
        assert!(other.grow(70), "the share the revoked holding gave back");
        let again = share.take(peer(2), 50).expect("an equal share of 50");
        assert!(other.is_revoked(), "its only holding gives way, whole");
        assert_eq!(share.used(), 50);
        other.release();
        drop(again);
        assert_eq!(share.used(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn growing_within_a_time_waits_for_units_given_back() {
        let share = FairShare::new(10);
        let first = share.take(peer(1), 10).unwrap();
        let mut second = share.hold_none(peer(1));
        let until = Instant::now() + Duration::from_secs(1);
        assert!(!second.grow_within(5, until).await, "nothing given back");
        assert_eq!(Instant::now(), until);
        let waiting = tokio::spawn(async move {
            let ok = second
                .grow_within(5, Instant::now() + Duration::from_secs(1))
                .await;
            (ok, second)
        });
        tokio::task::yield_now().await;
        drop(first);
        let (ok, second) = waiting.await.unwrap();
        assert!(ok, "woken when the first gave its units back");
        assert_eq!(second.amount(), 5);
    }

    #[test]
    fn the_addresses_of_one_ipv6_slash_64_are_one_peer() {
        let share = FairShare::new(2);
        let _a = share.take("2001:db8::1".parse().unwrap(), 1).unwrap();
        let _b = share.take("2001:db8::ffff:2".parse().unwrap(), 1).unwrap();
        assert!(
            share.take("2001:db8::3".parse().unwrap(), 1).is_none(),
            "a third address of the same /64 is the same peer, at its share"
        );
        assert!(share.take("2001:db8:0:1::1".parse().unwrap(), 1).is_some());
    }

    #[test]
    fn ipv4_mapped_addresses_are_one_peer() {
        let share = FairShare::new(2);
        let _a = share.take(peer(2), 1).unwrap();
        let mapped: IpAddr = "::ffff:127.0.0.2".parse().unwrap();
        let _b = share.take(mapped, 1).unwrap();
        assert!(share.take(peer(1), 1).is_some(), "peer 2 holds two: over 1");
    }

    #[test]
    fn a_peer_holding_nothing_gets_one_unit_among_more_peers_than_units() {
        let share = FairShare::new(4);
        let tenant: Vec<Hold> = (2..6)
            .map(|last| share.take(peer(last), 1).unwrap())
            .collect();
        let apiserver = share
            .take(peer(1), 1)
            .expect("one unit, an equal share rounded up");
        assert!(tenant[0].is_revoked(), "the oldest of the equals gives way");
        assert!(tenant[1..].iter().all(|h| !h.is_revoked()));
        assert!(share.take(peer(1), 1).is_none(), "one unit is its share");
        apiserver.protect();
        let more: Vec<Hold> = (6..40)
            .filter_map(|last| share.take(peer(last), 1))
            .collect();
        assert!(
            !apiserver.is_revoked(),
            "a protected holding is never taken"
        );
        assert_eq!(more.iter().filter(|h| !h.is_revoked()).count(), 3);
        assert_eq!(share.used(), 4);
        let second = share
            .take(peer(1), 1)
            .expect("protected units count against no share");
        assert!(!apiserver.is_revoked() && !second.is_revoked());
        drop((apiserver, second, more, tenant));
        assert_eq!(share.used(), 0);
    }
}
