//! An AMQP 1.0 client connection over TLS (fe2o3-amqp) for the AMQP benchmarks, and the
//! service side's C2D send as the official service SDKs do it: a CBS put-token on `$cbs`, then
//! sender links to `/messages/devicebound`.

use fe2o3_amqp::connection::ConnectionHandle;
use fe2o3_amqp::link::{Receiver, Sender};
use fe2o3_amqp::sasl_profile::SaslProfile;
use fe2o3_amqp::session::SessionHandle;
use fe2o3_amqp::types::messaging::{ApplicationProperties, Body, Message, Outcome, Properties};
use fe2o3_amqp::types::primitives::{SimpleValue, Value};
use fe2o3_amqp::{Connection, Session};
use rustls::pki_types::ServerName;
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;

/// Connects over TCP and TLS (no Nagle: the benchmarks measure latency) and opens the AMQP
/// connection with `sasl`.
pub async fn open(
    tls: &TlsConnector,
    host: &str,
    port: u16,
    container_id: &str,
    sasl: SaslProfile,
) -> anyhow::Result<ConnectionHandle<()>> {
    let tcp = TcpStream::connect((crate::dial::address_for(host), port)).await?;
    tcp.set_nodelay(true)?;
    let stream = tls
        .connect(ServerName::try_from(host.to_string())?, tcp)
        .await?;
    Ok(Connection::builder()
        .container_id(container_id)
        .hostname(host)
        .sasl_profile(sasl)
        .open_with_stream(stream)
        .await?)
}

/// A back-end's AMQP connection, authorized by a CBS put-token of the service `token`, with
/// one session for its links.
pub struct ServiceConnection {
    pub connection: ConnectionHandle<()>,
    pub session: SessionHandle<()>,
}

impl ServiceConnection {
    /// Opens the connection (SASL ANONYMOUS, as the SDKs do) and puts `token` on `$cbs`; an
    /// answer other than 200 is an error.
    pub async fn open(
        tls: &TlsConnector,
        host: &str,
        port: u16,
        container_id: &str,
        token: String,
    ) -> anyhow::Result<Self> {
        let mut connection = open(tls, host, port, container_id, SaslProfile::Anonymous).await?;
        let mut session = Session::begin(&mut connection).await?;
        let mut cbs_tx = Sender::attach(&mut session, "cbs-sender", "$cbs").await?;
        let mut cbs_rx = Receiver::attach(&mut session, "cbs-receiver", "$cbs").await?;
        let put = Message::builder()
            .properties(Properties::builder().message_id(1u64).build())
            .application_properties(
                ApplicationProperties::builder()
                    .insert("operation", "put-token")
                    .insert("type", "servicebus.windows.net:sastoken")
                    .insert("name", format!("https://{host}"))
                    .build(),
            )
            .value(token)
            .build();
        cbs_tx.send(put).await?;
        let answer = cbs_rx.recv::<Body<Value>>().await?;
        cbs_rx.accept(&answer).await?;
        let status = answer
            .message()
            .application_properties
            .as_ref()
            .and_then(|p| p.0.get("status-code").cloned());
        anyhow::ensure!(
            status == Some(SimpleValue::Int(200)),
            "put-token answered {status:?}"
        );
        let _ = cbs_tx.close().await;
        let _ = cbs_rx.close().await;
        Ok(Self {
            connection,
            session,
        })
    }

    /// Attaches a sender link to `/messages/devicebound` named `name`.
    pub async fn c2d_sender(&mut self, name: String) -> anyhow::Result<Sender> {
        Ok(Sender::attach(&mut self.session, name, "/messages/devicebound").await?)
    }

    /// Ends the session and closes the connection, ignoring errors (the run is over).
    pub async fn close(mut self) {
        let _ = self.session.end().await;
        let _ = self.connection.close().await;
    }
}

/// What the hub answered to one C2D send over AMQP.
#[derive(Debug, PartialEq, Eq)]
pub enum SendOutcome {
    Accepted,
    /// `amqp:resource-limit-exceeded`: the device's queue is full.
    QueueFull,
    /// Anything else, described.
    Refused(String),
}

/// Sends `body` to `device` with `message_id` on `link` and waits for the hub's disposition,
/// which it gives only once the message is durable.
pub async fn send_c2d(
    link: &mut Sender,
    device: &str,
    message_id: String,
    body: Vec<u8>,
) -> anyhow::Result<SendOutcome> {
    let message = Message::builder()
        .properties(
            Properties::builder()
                .to(format!("/devices/{device}/messages/devicebound"))
                .message_id(message_id)
                .build(),
        )
        .data(body)
        .build();
    Ok(outcome_of(link.send(message).await?))
}

fn outcome_of(outcome: Outcome) -> SendOutcome {
    use fe2o3_amqp::types::definitions::{AmqpError, ErrorCondition};
    match outcome {
        Outcome::Accepted(_) => SendOutcome::Accepted,
        Outcome::Rejected(r) => match r.error {
            Some(e)
                if e.condition == ErrorCondition::AmqpError(AmqpError::ResourceLimitExceeded) =>
            {
                SendOutcome::QueueFull
            }
            other => SendOutcome::Refused(format!("rejected: {other:?}")),
        },
        other => SendOutcome::Refused(format!("{other:?}")),
    }
}
