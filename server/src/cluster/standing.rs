//! A node's standing in the cluster: its role, how far it holds the log, whether NATS answers
//! it, and so whether it may serve clients. The health endpoint reports it, the metrics carry
//! it, and a follower serves only while it says so.
//!
//! # Invariants
//! - NATS counts as reachable while a message this node published came back through the
//!   server within the last lease time ([`watch_contact`]: a connection cut without a reset,
//!   a partition or a firewall, stops answering long before the client library notices) and
//!   the log's stream leader answered within the lease too (a NATS server cut off from the
//!   others still echoes, but has no log to give).
//! - A follower may serve only while NATS is reachable and it has applied the log up to the
//!   end it read since it last regained NATS ([`Standing::may_follow_serve`]): a node cut off
//!   from the log stops serving once the lease time has passed, and one that comes back
//!   serves again only after catching up, so it never answers from the state it had while
//!   cut off.
//! - A writer's lease deadline ([`Standing::set_lease_until`]) is what its own watch
//!   ([`super::writer`]) stops serving at; the standing only reports it.

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use parking_lot::Mutex;
use serde::Serialize;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// What a node is doing in the cluster.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Role {
    /// Connecting, or between roles.
    Starting,
    /// Applying the log; serving from its replica when [`Standing::may_follow_serve`].
    Follower,
    /// Holds the lease and is applying the log to its end before it writes.
    CatchingUp,
    Writer,
}

#[derive(Debug)]
struct State {
    role: Role,
    applied: u64,
    log_first: u64,
    log_end: Option<u64>,
    log_bytes: u64,
    last_contact: Option<Instant>,
    /// When the log's stream leader last answered (its state read).
    last_log_answer: Option<Instant>,
    lease_until: Option<Instant>,
    serving: bool,
    /// The log's end read after NATS was last regained; `None` until then.
    serve_after: Option<u64>,
}

/// The node's standing, shared by its follower, writer, health endpoint and contact watch.
pub struct Standing {
    node: String,
    lease: Duration,
    state: Mutex<State>,
    may_serve: watch::Sender<bool>,
}

/// What `/health/cluster` answers.
#[derive(Debug, Serialize)]
pub struct Report {
    pub node: String,
    pub role: Role,
    /// Whether this node takes clients now.
    pub serving: bool,
    pub nats_reachable: bool,
    /// Milliseconds since NATS last answered this node; `None` before it ever did.
    pub nats_last_answer_ms: Option<u64>,
    /// The last log sequence this node's replica (or store) holds.
    pub applied: u64,
    /// The log's last sequence when this node last read it.
    pub log_end: Option<u64>,
    /// Entries of the log this node has not applied, as of `log_end`.
    pub lag: Option<u64>,
    pub log_first: u64,
    pub log_bytes: u64,
    pub lease_held: bool,
    /// Milliseconds until the writer's lease runs out unless renewed.
    pub lease_left_ms: Option<u64>,
}

impl Standing {
    pub fn new(node: &str, lease: Duration) -> Arc<Standing> {
        let (may_serve, _) = watch::channel(false);
        Arc::new(Standing {
            node: node.to_string(),
            lease,
            state: Mutex::new(State {
                role: Role::Starting,
                applied: 0,
                log_first: 0,
                log_end: None,
                log_bytes: 0,
                last_contact: None,
                last_log_answer: None,
                lease_until: None,
                serving: false,
                serve_after: None,
            }),
            may_serve,
        })
    }

    fn reachable(&self, s: &State) -> bool {
        let recent = |t: Option<Instant>| t.is_some_and(|t| t.elapsed() < self.lease);
        recent(s.last_contact) && recent(s.last_log_answer)
    }

    /// Whether a follower may serve in state `s` (see the module invariants).
    fn follower_may_serve(&self, s: &State) -> bool {
        s.role == Role::Follower
            && self.reachable(s)
            && s.serve_after.is_some_and(|end| s.applied >= end)
    }

    /// Recomputes whether a follower may serve, and publishes it.
    fn settle(&self, s: &mut State) {
        let reachable = self.reachable(s);
        if !reachable {
            s.serve_after = None;
        }
        let may = self.follower_may_serve(s);
        self.may_serve.send_if_modified(|old| {
            let changed = *old != may;
            *old = may;
            changed
        });
        metrics::gauge!("ferrohub_cluster_nats_reachable").set(f64::from(u8::from(reachable)));
    }

    pub fn set_role(&self, role: Role) {
        let mut s = self.state.lock();
        if s.role != role {
            // A follower serves again only after reading the log's end anew.
            s.serve_after = None;
            let was_writer = s.role == Role::Writer;
            if was_writer || role == Role::Writer {
                metrics::counter!("ferrohub_cluster_lease_changes_total").increment(1);
            }
            tracing::debug!(?role, "cluster role");
        }
        s.role = role;
        if role != Role::Writer && role != Role::CatchingUp {
            s.lease_until = None;
        }
        metrics::gauge!("ferrohub_cluster_writer").set(f64::from(u8::from(role == Role::Writer)));
        self.settle(&mut s);
    }

    pub fn role(&self) -> Role {
        self.state.lock().role
    }

    /// NATS answered this node now.
    pub fn contact(&self) {
        let mut s = self.state.lock();
        s.last_contact = Some(Instant::now());
        self.settle(&mut s);
    }

    /// Re-evaluates reachability (time passes without an answer).
    pub fn recheck(&self) {
        let mut s = self.state.lock();
        self.settle(&mut s);
    }

    pub fn nats_reachable(&self) -> bool {
        let s = self.state.lock();
        self.reachable(&s)
    }

    pub fn set_applied(&self, applied: u64) {
        let mut s = self.state.lock();
        s.applied = applied;
        // The log holds at least what was applied from it.
        if s.log_end.is_some_and(|end| end < applied) {
            s.log_end = Some(applied);
        }
        metrics::gauge!("ferrohub_cluster_applied_sequence").set(applied as f64);
        if let Some(end) = s.log_end {
            metrics::gauge!("ferrohub_cluster_lag_entries").set(end.saturating_sub(applied) as f64);
        }
        self.settle(&mut s);
    }

    /// The log as last read from its stream leader: first and last sequences, bytes held.
    pub fn set_log(&self, first: u64, end: u64, bytes: u64) {
        let mut s = self.state.lock();
        s.last_log_answer = Some(Instant::now());
        s.log_first = first;
        s.log_end = Some(end);
        s.log_bytes = bytes;
        if self.reachable(&s) && s.serve_after.is_none() {
            s.serve_after = Some(end);
        }
        metrics::gauge!("ferrohub_cluster_log_last_sequence").set(end as f64);
        metrics::gauge!("ferrohub_cluster_log_bytes").set(bytes as f64);
        metrics::gauge!("ferrohub_cluster_lag_entries").set(end.saturating_sub(s.applied) as f64);
        self.settle(&mut s);
    }

    /// The writer's lease runs out at `until` unless renewed.
    pub fn set_lease_until(&self, until: Option<Instant>) {
        self.state.lock().lease_until = until;
    }

    pub fn set_serving(&self, serving: bool) {
        self.state.lock().serving = serving;
    }

    /// Whether a follower may serve clients now (see the module invariants).
    pub fn may_follow_serve(&self) -> watch::Receiver<bool> {
        self.may_serve.subscribe()
    }

    /// Whether this node takes clients and should: what a balancer's health check asks.
    pub fn ready(&self) -> Result<(), String> {
        let mut s = self.state.lock();
        // Time passes between the contact watch's rounds: judge it now.
        self.settle(&mut s);
        if !s.serving {
            return Err(format!("not serving ({:?})", s.role));
        }
        match s.role {
            Role::Writer if s.lease_until.is_some_and(|t| t > Instant::now()) => Ok(()),
            Role::Writer => Err("the writer lease ran out unrenewed".into()),
            Role::Follower if self.follower_may_serve(&s) => Ok(()),
            Role::Follower => Err("NATS unreachable or the replica behind the log".into()),
            other => Err(format!("between roles ({other:?})")),
        }
    }

    pub fn report(&self) -> Report {
        let serving = self.ready().is_ok();
        // `ready` settled the state just now.
        let s = self.state.lock();
        let now = Instant::now();
        Report {
            node: self.node.clone(),
            role: s.role,
            serving,
            nats_reachable: self.reachable(&s),
            nats_last_answer_ms: s.last_contact.map(|t| t.elapsed().as_millis() as u64),
            applied: s.applied,
            log_end: s.log_end,
            lag: s.log_end.map(|end| end.saturating_sub(s.applied)),
            log_first: s.log_first,
            log_bytes: s.log_bytes,
            lease_held: s.lease_until.is_some_and(|t| t > now),
            lease_left_ms: s
                .lease_until
                .map(|t| t.saturating_duration_since(now).as_millis() as u64),
        }
    }
}

/// Publishes to a subject only this node hears, every `every`, and records each message that
/// comes back through the server as contact, until `stop`. A cut connection (packets dropped,
/// no reset) shows as no answers within a probe, long before the client's own pings notice.
pub async fn watch_contact(
    client: async_nats::Client,
    standing: Arc<Standing>,
    every: Duration,
    stop: CancellationToken,
) {
    let subject = format!("ferrohub.contact.{}", client.new_inbox());
    let mut echoes = loop {
        match client.subscribe(subject.clone()).await {
            Ok(s) => break s,
            Err(e) => {
                tracing::warn!(error = %e, "cannot watch NATS contact; trying again");
                tokio::select! {
                    _ = stop.cancelled() => return,
                    _ = tokio::time::sleep(every) => {}
                }
            }
        }
    };
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tick.tick() => {}
        }
        // Publishing only queues on the client; the echo is what proves the round trip.
        let _ = client.publish(subject.clone(), bytes::Bytes::new()).await;
        let echo = tokio::time::timeout(every, async { echoes.next().await }).await;
        match echo {
            Ok(Some(_)) => {
                standing.contact();
                // Echoes of earlier probes that came late are drained by the next waits.
            }
            Ok(None) => return,
            Err(_) => standing.recheck(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn may(s: &Standing) -> bool {
        *s.may_follow_serve().borrow()
    }

    #[test]
    fn a_follower_serves_once_it_reached_nats_and_applied_the_end_it_read() {
        let s = Standing::new("n", Duration::from_secs(60));
        s.set_role(Role::Follower);
        s.set_log(1, 10, 100);
        assert!(!may(&s), "no contact yet");
        s.contact();
        s.set_log(1, 10, 100);
        assert!(!may(&s), "behind the end it read");
        s.set_applied(9);
        assert!(!may(&s));
        s.set_applied(10);
        assert!(may(&s));
        s.set_serving(true);
        assert!(s.ready().is_ok());
        // The log moving on does not stop it: it was caught up once since reaching NATS.
        s.set_log(1, 12, 120);
        assert!(may(&s));
    }

    #[test]
    fn a_follower_out_of_touch_for_the_lease_stops_and_catches_up_before_serving_again() {
        let s = Standing::new("n", Duration::from_millis(50));
        s.set_role(Role::Follower);
        s.contact();
        s.set_log(1, 5, 50);
        s.set_applied(5);
        s.set_serving(true);
        assert!(may(&s));
        std::thread::sleep(Duration::from_millis(80));
        s.recheck();
        assert!(!may(&s));
        assert!(s.ready().is_err());
        assert!(!s.report().nats_reachable);
        // Back in touch: the end it read before does not count, a new one must be read.
        s.contact();
        assert!(!may(&s));
        s.set_log(1, 8, 80);
        assert!(!may(&s), "the log moved on while it was away");
        s.set_applied(8);
        assert!(may(&s));
    }

    #[test]
    fn only_a_follower_serves_by_the_gate_and_a_writer_by_its_lease() {
        let s = Standing::new("n", Duration::from_secs(60));
        s.contact();
        s.set_role(Role::Writer);
        s.set_log(1, 3, 30);
        s.set_applied(3);
        s.set_serving(true);
        assert!(!may(&s), "the gate is a follower's");
        assert!(s.ready().is_err(), "no lease deadline yet");
        s.set_lease_until(Some(Instant::now() + Duration::from_secs(1)));
        assert!(s.ready().is_ok());
        assert!(s.report().lease_held);
        s.set_lease_until(Some(Instant::now()));
        assert!(s.ready().is_err(), "a lease run out");
        s.set_role(Role::Follower);
        assert!(
            !may(&s),
            "a writer stepping down reads the log's end again first"
        );
        s.set_log(1, 3, 30);
        assert!(may(&s));
    }
}
