//! The writes a client may ask of any node, as serializable calls (docs/cluster.md, "Serving
//! from every node"): the seam's request types. On a single node and on a cluster's writer a
//! call runs here, through the store handle, exactly as before; on a follower
//! [`HubContext::write`] sends it to the writer over NATS, and the writer runs it.
//!
//! # Invariants
//! - A call holds everything its engine work needs (ids, bodies, the time it was asked at), so
//!   it runs the same on whichever node receives it. What it does on the writer alone
//!   (deadline alarms, job runners, the routing table) is inside [`WriterCall::run`]; what
//!   reaches connections (kicks, desired patches, C2D wake-ups) is done by the node the
//!   client asked, after the call, through [`super::Connections`], which reaches every node.
//! - A follower answers only once its replica applied the sequence the writer's answer names
//!   ([`super::cluster::Cluster::applied_through`]): read-your-writes on every node.
//! - A call nobody received (no writer at the moment: a failover) is sent again for up to
//!   [`FAILOVER_PATIENCE`], unless this follower stopped serving (it is becoming the writer);
//!   one that was sent but not answered is a 503 (it may have run), as IoT Hub's own 503s
//!   are. A follower that stopped serving waits for no answer: its drain of connections (and
//!   so a failover to it) is not held by a request the lost writer will never answer.
//! - The writer takes each call once: it listens in a queue group, so a writer that is
//!   stepping down and its successor never both run one.

mod c2d;
mod events;
mod jobs;
mod policies;
mod provisioning;
mod registry;
mod sessions;
mod twins;

use std::future::Future;
use std::time::{Duration, Instant};

use bytes::Bytes;
use ferrohub_engine::StorageError;
use futures::StreamExt;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;

pub use c2d::*;
pub use events::*;
pub use jobs::*;
pub use policies::*;
pub use provisioning::*;
pub use registry::*;
pub use sessions::*;
pub use twins::*;

use super::cluster::Cluster;
use super::HubContext;
use crate::cluster::bus::{self, BusError};

/// How long a call is sent again while no writer listens.
pub(crate) const FAILOVER_PATIENCE: Duration = Duration::from_secs(20);
/// How long a sent call waits for the writer's answer.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(30);
/// The pause between sends while no writer listens.
pub(crate) const RESEND_PAUSE: Duration = Duration::from_millis(200);

/// A write any node may be asked for; runs on the writer.
pub trait WriterCall: Serialize + DeserializeOwned + Send + Sized + 'static {
    type Answer: Serialize + DeserializeOwned + Send + 'static;
    type Error: Serialize + DeserializeOwned + From<StorageError> + Send + 'static;

    /// The call's work, on the node that writes (a single node, or the cluster's writer).
    fn run(self, ctx: HubContext)
        -> impl Future<Output = Result<Self::Answer, Self::Error>> + Send;
}

/// Defines a call: a struct of its fields, and its work.
macro_rules! writer_call {
    (
        $(#[$meta:meta])*
        pub struct $name:ident { $($(#[$fmeta:meta])* pub $field:ident : $ty:ty),* $(,)? }
        -> Result<$answer:ty, $error:ty>;
        |$ctx:ident, $call:ident| $body:expr
    ) => {
        $(#[$meta])*
        #[derive(Debug, serde::Serialize, serde::Deserialize)]
        pub struct $name { $($(#[$fmeta])* pub $field: $ty),* }

        impl $crate::hub::calls::WriterCall for $name {
            type Answer = $answer;
            type Error = $error;

            #[allow(clippy::manual_async_fn)]
            fn run(
                self,
                $ctx: $crate::hub::HubContext,
            ) -> impl std::future::Future<Output = Result<$answer, $error>> + Send {
                let $call = self;
                async move { $body }
            }
        }
    };
}
pub(crate) use writer_call;

/// Every call, for the writer to tell them apart.
macro_rules! calls {
    ($($name:ident),* $(,)?) => {
        #[derive(Debug, Serialize, Deserialize)]
        pub enum Call { $($name($name)),* }

        $(impl From<$name> for Call {
            fn from(c: $name) -> Call { Call::$name(c) }
        })*

        impl Call {
            /// Runs the call and encodes its result.
            async fn run_encoded(self, ctx: HubContext) -> Vec<u8> {
                match self { $(Call::$name(c) => encode(&c.run(ctx).await)),* }
            }
        }
    };
}

calls! {
    CreateDevice, UpdateDevice, CreateModule, UpdateModule, DeleteIdentity, BulkIdentities,
    PutCertificate, DeleteCertificate,
    WriteTwin, PatchDigitalTwin, PatchReported, SetModelId,
    SendC2d, PurgeC2d, ReceiveC2d, SettleC2d, CompleteAndReceiveC2d,
    ReceiveFeedback, SettleFeedback,
    EnqueueFileNotification, ReceiveFileNotification, SettleFileNotification,
    OpenSession, RecordConnection, RecordDisconnection, RecordActivity, SaveSession,
    CreateConsumerGroup, DeleteConsumerGroup, SetCheckpoint, CreateEndpoint, SetEndpointDelivery, DeleteEndpoint, EndpointsHealth,
    ChangeRouting,
    CreateJob, CancelJob, CreateScheduledJob, CancelScheduledJob,
    PutConfiguration, DeleteConfiguration,
    PutEnrollment, DeleteEnrollment, BulkEnrollments, DeleteRegistration, AssignRegistration,
    RemoveEndpointTarget,
    ChangePolicy,
}

fn encode<T: Serialize>(value: &T) -> Vec<u8> {
    rmp_serde::to_vec_named(value).expect("a call's parts always encode")
}

/// The writer's answer to a forwarded call: the encoded result, and the log sequence every
/// write the call made is at or below.
#[derive(Serialize, Deserialize)]
struct Reply {
    seq: u64,
    /// The call's encoded `Result`, or why the writer could not run it.
    answer: Result<serde_bytes::ByteBuf, String>,
}

impl HubContext {
    /// Makes a write: here, or on a follower by the cluster's writer (see the module docs).
    ///
    /// # Errors
    /// The call's own, and on a follower [`StorageError::Unavailable`] when the writer could
    /// not be reached.
    pub async fn write<C>(&self, call: C) -> Result<C::Answer, C::Error>
    where
        C: WriterCall,
        Call: From<C>,
    {
        match self.cluster.as_deref() {
            Some(cluster) if cluster.is_follower() => forward::<C>(cluster, Call::from(call)).await,
            _ => call.run(self.clone()).await,
        }
    }
}

/// Why a forwarded write ended unanswered on a node that stopped serving in its role.
pub(crate) const STOPPED_SERVING: &str =
    "this node stopped serving as a follower before the writer answered; the write may or may not have happened";

async fn forward<C: WriterCall>(cluster: &Cluster, call: Call) -> Result<C::Answer, C::Error> {
    let request = Bytes::from(encode(&call));
    let unavailable = |e: String| C::Error::from(StorageError::Unavailable(e));
    let give_up = Instant::now() + FAILOVER_PATIENCE;
    let bytes = loop {
        // A follower that stopped serving drains its connections before it can become the
        // writer: an answer the lost writer will never send must not hold the drain.
        let asked = tokio::select! {
            a = cluster.bus.request(bus::CALLS, request.clone(), ANSWER_TIMEOUT) => a,
            _ = cluster.stopping().cancelled() => {
                return Err(unavailable(STOPPED_SERVING.into()));
            }
        };
        match asked {
            Ok(b) => break b,
            // A follower that stopped serving (it may be becoming the writer) waits no more.
            Err(BusError::NoResponders(_))
                if Instant::now() < give_up && !cluster.stopping().is_cancelled() =>
            {
                tokio::select! {
                    _ = cluster.stopping().cancelled() => {}
                    _ = tokio::time::sleep(RESEND_PAUSE) => {}
                }
            }
            Err(e) => return Err(unavailable(e.to_string())),
        }
    };
    let reply: Reply = rmp_serde::from_slice(&bytes)
        .map_err(|e| unavailable(format!("the writer's answer does not decode: {e}")))?;
    let answer = reply.answer.map_err(unavailable)?;
    cluster.applied_through(reply.seq).await;
    rmp_serde::from_slice::<Result<C::Answer, C::Error>>(&answer)
        .map_err(|e| unavailable(format!("the writer's answer does not decode: {e}")))?
}

/// The writer's side: takes forwarded calls until `stop`, each in a task of its own.
pub async fn serve(ctx: HubContext, stop: CancellationToken) {
    let Some(cluster) = ctx.cluster.clone() else {
        return;
    };
    let mut calls = match cluster.bus.queue_subscribe(bus::CALLS, "writer").await {
        Ok(s) => s,
        Err(e) => {
            tracing::error!(error = %e, "cannot take forwarded calls; followers' writes will fail");
            return;
        }
    };
    loop {
        let message = tokio::select! {
            _ = stop.cancelled() => return,
            m = calls.next() => match m {
                Some(m) => m,
                None => return,
            },
        };
        let (ctx, bus) = (ctx.clone(), cluster.bus.clone());
        tokio::spawn(async move {
            let answer = match rmp_serde::from_slice::<Call>(&message.payload) {
                Ok(call) => Ok(serde_bytes::ByteBuf::from(
                    call.run_encoded(ctx.clone()).await,
                )),
                Err(e) => Err(format!(
                    "the call does not decode (another ferrohub version?): {e}"
                )),
            };
            let reply = Reply {
                seq: ctx.store.last_logged_sequence(),
                answer,
            };
            bus.respond(&message, Bytes::from(encode(&reply))).await;
        });
    }
}
