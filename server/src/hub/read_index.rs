//! What a read on a cluster follower waits for: the log's end as its stream leader reports it,
//! asked once for every read that came while no request was out ("read index", as Raft
//! systems call it).
//!
//! # Invariants
//! - A read uses only an answer to a request sent after the read arrived: a write acknowledged
//!   before the read came is then at or below the answer. A request already out when the read
//!   arrived is waited out, then the read joins (or sends) the next one.
//! - At most one request is out per node at any moment, however many reads wait: a burst of
//!   reads costs NATS one request, or two.

use std::sync::atomic::{AtomicU64, Ordering};

use futures::future::{BoxFuture, FutureExt, Shared};
use parking_lot::Mutex;

use crate::cluster::Link;

type Ask = Shared<BoxFuture<'static, Result<u64, String>>>;

pub struct ReadIndex {
    link: Link,
    /// How many requests were sent (the number of the latest).
    sent: AtomicU64,
    /// The request out now, and its number.
    out: Mutex<Option<(u64, Ask)>>,
}

enum Step {
    /// A request sent after the read came: its answer serves.
    Join(u64, Ask),
    /// A request that may have been sent before the read came: wait it out.
    WaitOut(u64, Ask),
}

impl ReadIndex {
    pub fn new(link: Link) -> ReadIndex {
        ReadIndex {
            link,
            sent: AtomicU64::new(0),
            out: Mutex::new(None),
        }
    }

    /// The log's end, from a request sent after this call began.
    ///
    /// # Errors
    /// NATS unreachable, or the log's stream without a leader that heard from a majority.
    pub async fn log_end(&self) -> Result<u64, String> {
        let seen = self.sent.load(Ordering::Acquire);
        loop {
            let step = {
                let mut out = self.out.lock();
                match &*out {
                    Some((n, ask)) if *n > seen => Step::Join(*n, ask.clone()),
                    Some((n, ask)) => Step::WaitOut(*n, ask.clone()),
                    None => {
                        let n = self.sent.fetch_add(1, Ordering::AcqRel) + 1;
                        let link = self.link.clone();
                        let ask = async move { link.log_end().await.map_err(|e| e.to_string()) }
                            .boxed()
                            .shared();
                        *out = Some((n, ask.clone()));
                        Step::Join(n, ask)
                    }
                }
            };
            match step {
                Step::Join(n, ask) => {
                    let answer = ask.await;
                    self.done(n);
                    return answer;
                }
                Step::WaitOut(n, ask) => {
                    let _ = ask.await;
                    self.done(n);
                }
            }
        }
    }

    /// Request `n` was answered: the next read sends a new one.
    fn done(&self, n: u64) {
        let mut out = self.out.lock();
        if out.as_ref().is_some_and(|(current, _)| *current == n) {
            *out = None;
        }
    }
}
