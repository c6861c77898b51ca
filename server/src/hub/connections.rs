//! Who is connected right now: the only place that knows. One entry per client id (MQT-3):
//! registering a client id that is already present kicks the older connection.
//!
//! # Invariants
//! - At most one live registration per client id; a registration removes itself on drop only
//!   if it is still the current one, so a superseded connection cannot evict its successor.
//! - Kicking only signals; the connection task closes itself and runs its own clean-up.
//! - In a cluster ([`Reach`], set once), what finds no connection here goes to the other
//!   nodes: kicks always do (a device's modules may be anywhere), desired patches and C2D
//!   wake-ups when the identity is not connected here; and a registration announces itself,
//!   so the identity's connection on another node is ended (the newer one wins, MQT-3).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::ids::{ClientId, DeviceId, Identity};

/// What the hub pushes to a connected device, outside any request of its own.
///
/// Kept small (the method call is boxed): every connection's queue preallocates a block of
/// 32 of these, idle or not.
#[derive(Debug, Clone)]
pub enum Outbound {
    /// A desired-properties change (TWN-8): the JSON body as the back-end sent it, with
    /// `$version`.
    DesiredPatch { version: u64, body: Vec<u8> },
    /// A direct method call (MTH-1): answered through [`crate::hub::methods::PendingCalls`].
    MethodRequest(Box<MethodRequestOut>),
    /// A C2D message that its send already locked for this connection (the device's queue
    /// was empty and the connection receiving): publish it, or abandon it if it cannot.
    C2d(Box<ferrohub_engine::c2d::Delivered>),
}

/// What a connection shares with C2D senders: the wake-up that makes it look at its queue,
/// and whether its session takes C2D messages now. While it does, a send to the device's
/// empty queue locks the message for it in the send's own commit and hands it over
/// ([`Connections::hand_c2d`]) instead of waking it to fetch.
#[derive(Default)]
pub struct C2dSignal {
    pub wake: tokio::sync::Notify,
    pub receiving: AtomicBool,
}

/// A direct method call on its way to the device.
#[derive(Debug, Clone)]
pub struct MethodRequestOut {
    pub rid: String,
    pub method: String,
    pub payload: Vec<u8>,
}

/// Outbound messages a connection may have queued; beyond this they are dropped (a twin
/// notification is not kept: the device converges by a twin GET, TWN-8).
pub const OUTBOUND_QUEUE: usize = 64;

/// Why a connection was told to close.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KickReason {
    /// A newer connection with the same client id.
    Replaced,
    /// The identity was disabled or deleted.
    IdentityChanged,
}

struct Entry {
    id: u64,
    outbound: mpsc::Sender<Outbound>,
    /// Whether the session subscribed to `$iothub/methods/POST/#` (kept by the connection).
    methods: Arc<std::sync::atomic::AtomicBool>,
    /// Tells the connection to look at its device's C2D queue again.
    c2d: Arc<C2dSignal>,
    device_id: DeviceId,
    is_module: bool,
    kick: CancellationToken,
    reason: Arc<Mutex<Option<KickReason>>>,
}

/// What [`Connections`] needs of a cluster's other nodes (`super::live` provides it).
pub trait Reach: Send + Sync {
    /// A connection of `who` registered here as number `id`: hear its identity's traffic from
    /// other nodes, and end its connections there. Stops when the returned guard is dropped.
    fn registered(&self, who: &Identity, id: u64) -> Box<dyn Send + Sync>;
    /// A desired patch for an identity not connected here.
    fn desired_patch(&self, client_id: &ClientId, version: u64, body: &[u8]);
    /// A C2D wake-up for a device not connected here.
    fn wake_c2d(&self, device_id: &DeviceId);
    /// Kicks `who`'s connections on other nodes (with `device_wide`, its modules' too).
    fn kick(&self, who: &Identity, device_wide: bool);
}

#[derive(Default)]
pub struct Connections {
    entries: Mutex<HashMap<ClientId, Entry>>,
    /// The other nodes of a cluster; unset on a single node.
    reach: std::sync::OnceLock<Arc<dyn Reach>>,
    next_id: AtomicU64,
    connected_devices: AtomicU64,
    /// The most messages any one connection's outbound queue has held.
    outbound_high_water: AtomicU64,
}

/// A live connection's place in [`Connections`].
pub struct Registration {
    /// Set by the connection while its session subscribes to methods.
    pub methods: Arc<std::sync::atomic::AtomicBool>,
    /// Notified when the device's C2D queue may have deliverable messages.
    pub c2d: Arc<C2dSignal>,
    connections: Arc<Connections>,
    client_id: ClientId,
    id: u64,
    pub kicked: CancellationToken,
    reason: Arc<Mutex<Option<KickReason>>>,
    /// The other nodes' traffic for this connection, heard while this lives.
    _reached: Option<Box<dyn Send + Sync>>,
}

impl Registration {
    /// This connection's number on its node (unique there while the node runs).
    pub fn id(&self) -> u64 {
        self.id
    }

    pub fn kick_reason(&self) -> Option<KickReason> {
        *self.reason.lock()
    }

    /// Whether this is still the client id's current connection.
    pub fn is_current(&self) -> bool {
        self.connections.holds(&self.client_id, self.id)
    }

    /// [`Registration::is_current`] as a check that can be made later on another thread: the
    /// engine makes it under the device's lock, so a newer connection that registered first
    /// is seen (see `Store::record_disconnection_then`).
    pub fn current_check(&self) -> impl Fn() -> bool + Clone + Send + Sync + 'static {
        let (connections, client_id, id) = (
            Arc::clone(&self.connections),
            self.client_id.clone(),
            self.id,
        );
        move || connections.holds(&client_id, id)
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        let mut entries = self.connections.entries.lock();
        if entries
            .get(&self.client_id)
            .is_some_and(|e| e.id == self.id)
        {
            if let Some(e) = entries.remove(&self.client_id) {
                if !e.is_module {
                    self.connections
                        .connected_devices
                        .fetch_sub(1, Ordering::Relaxed);
                }
            }
        }
    }
}

impl Connections {
    pub fn new() -> Arc<Self> {
        Arc::new(Connections::default())
    }

    /// Makes this node's connections reach a cluster's other nodes (once, before serving).
    pub fn set_reach(&self, reach: Arc<dyn Reach>) {
        let _ = self.reach.set(reach);
    }

    /// Whether this node has other nodes to reach.
    pub fn is_clustered(&self) -> bool {
        self.reach.get().is_some()
    }

    /// Ends the registration `id` of `client_id` if it still is the current one: a newer
    /// connection of the identity on another node took over.
    pub fn replaced_elsewhere(&self, client_id: &ClientId, id: u64) {
        if let Some(e) = self.entries.lock().get(client_id).filter(|e| e.id == id) {
            *e.reason.lock() = Some(KickReason::Replaced);
            e.kick.cancel();
        }
    }

    fn holds(&self, client_id: &ClientId, id: u64) -> bool {
        self.entries
            .lock()
            .get(client_id)
            .is_some_and(|e| e.id == id)
    }

    /// Registers a connection, kicking any older one with the same client id.
    pub fn register(
        self: &Arc<Self>,
        who: &Identity,
        outbound: mpsc::Sender<Outbound>,
    ) -> Registration {
        let (client_id, is_module) = (who.client_id(), who.is_module());
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let kick = CancellationToken::new();
        let reason = Arc::new(Mutex::new(None));
        let methods = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let c2d = Arc::new(C2dSignal::default());
        let entry = Entry {
            id,
            outbound,
            methods: Arc::clone(&methods),
            c2d: Arc::clone(&c2d),
            device_id: who.device_id.clone(),
            is_module,
            kick: kick.clone(),
            reason: Arc::clone(&reason),
        };
        {
            let mut entries = self.entries.lock();
            match entries.insert(client_id.clone(), entry) {
                Some(old) => {
                    *old.reason.lock() = Some(KickReason::Replaced);
                    old.kick.cancel();
                }
                None if !is_module => {
                    self.connected_devices.fetch_add(1, Ordering::Relaxed);
                }
                None => {}
            }
        }
        let reached = self.reach.get().map(|r| r.registered(who, id));
        Registration {
            _reached: reached,
            methods,
            c2d,
            connections: Arc::clone(self),
            client_id,
            id,
            kicked: kick,
            reason,
        }
    }

    /// Kicks the device's connection and those of all its modules, here and on every other
    /// node; how many were here.
    pub fn kick_device(&self, device_id: &DeviceId) -> usize {
        if let Some(reach) = self.reach.get() {
            reach.kick(&Identity::for_device(device_id.as_str()), true);
        }
        self.kick_device_here(device_id)
    }

    /// [`Connections::kick_device`] on this node only.
    pub fn kick_device_here(&self, device_id: &DeviceId) -> usize {
        let entries = self.entries.lock();
        let mut n = 0;
        for e in entries.values().filter(|e| e.device_id == *device_id) {
            *e.reason.lock() = Some(KickReason::IdentityChanged);
            e.kick.cancel();
            n += 1;
        }
        n
    }

    /// Kicks the identity's connections: a device's with its modules', or one module's.
    pub fn kick(&self, who: &Identity) {
        if who.is_module() {
            self.kick_client(&who.client_id());
        } else {
            self.kick_device(&who.device_id);
        }
    }

    /// Kicks one module's connection.
    pub fn kick_client(&self, client_id: &ClientId) {
        if let Some(reach) = self.reach.get() {
            reach.kick(&Identity::of_client(client_id), false);
        }
        self.kick_client_here(client_id);
    }

    /// [`Connections::kick_client`] on this node only.
    pub fn kick_client_here(&self, client_id: &ClientId) {
        if let Some(e) = self.entries.lock().get(client_id) {
            *e.reason.lock() = Some(KickReason::IdentityChanged);
            e.kick.cancel();
        }
    }

    /// Queues a message for a connected client; false if it is not connected or its queue is
    /// full (the message is then dropped). In a cluster, a desired patch for a client not
    /// connected here goes to the node that holds it (true: sent on).
    pub fn notify(&self, client_id: &ClientId, message: Outbound) -> bool {
        if let Some(e) = self.entries.lock().get(client_id) {
            let sent = e.outbound.try_send(message).is_ok();
            self.note_depth(&e.outbound);
            return sent;
        }
        match (self.reach.get(), &message) {
            (Some(reach), Outbound::DesiredPatch { version, body }) => {
                reach.desired_patch(client_id, *version, body);
                true
            }
            _ => false,
        }
    }

    /// [`Connections::notify`] on this node only.
    pub fn notify_here(&self, client_id: &ClientId, message: Outbound) -> bool {
        match self.entries.lock().get(client_id) {
            Some(e) => {
                let sent = e.outbound.try_send(message).is_ok();
                self.note_depth(&e.outbound);
                sent
            }
            None => false,
        }
    }

    /// Records the depth of an outbound queue a message was just put on.
    pub fn note_depth(&self, outbound: &mpsc::Sender<Outbound>) {
        let depth = (outbound.max_capacity() - outbound.capacity()) as u64;
        self.outbound_high_water.fetch_max(depth, Ordering::Relaxed);
    }

    /// The most messages any one connection's outbound queue has held since start.
    pub fn outbound_high_water(&self) -> u64 {
        self.outbound_high_water.load(Ordering::Relaxed)
    }

    /// The outbound queue of a client that is connected and subscribed to methods.
    pub fn method_target(&self, client_id: &ClientId) -> Option<mpsc::Sender<Outbound>> {
        let entries = self.entries.lock();
        let e = entries.get(client_id)?;
        // A kicked connection (its identity deleted or disabled) takes no more calls.
        (e.methods.load(Ordering::Acquire) && !e.kick.is_cancelled()).then(|| e.outbound.clone())
    }

    /// Wakes the C2D delivery of a device's connection, if it is connected (in a cluster,
    /// on whichever node holds it).
    pub fn wake_c2d(&self, device_id: &DeviceId) {
        if !self.wake_c2d_here(device_id) {
            if let Some(reach) = self.reach.get() {
                reach.wake_c2d(device_id);
            }
        }
    }

    /// [`Connections::wake_c2d`] on this node only; whether the device is connected here.
    pub fn wake_c2d_here(&self, device_id: &DeviceId) -> bool {
        // A device's client id is its device id.
        match self.entries.lock().get(device_id.as_str()) {
            Some(e) if !e.is_module => {
                e.c2d.wake.notify_one();
                true
            }
            _ => false,
        }
    }

    /// Whether the device's connection takes C2D messages now (subscribed, not kicked).
    pub fn receives_c2d(&self, device_id: &DeviceId) -> bool {
        self.entries
            .lock()
            .get(device_id.as_str())
            .is_some_and(|e| {
                !e.is_module && !e.kick.is_cancelled() && e.c2d.receiving.load(Ordering::Acquire)
            })
    }

    /// Hands a message locked on send to the device's connection; gives it back when the
    /// device is no longer connected or its outbound queue is full or closed.
    pub fn hand_c2d(
        &self,
        device_id: &DeviceId,
        message: ferrohub_engine::c2d::Delivered,
    ) -> Result<(), ferrohub_engine::c2d::Delivered> {
        let entries = self.entries.lock();
        let permit = match entries.get(device_id.as_str()) {
            Some(e) if !e.is_module => e.outbound.try_reserve().ok().map(|p| (p, &e.outbound)),
            _ => None,
        };
        let handed = match permit {
            Some((permit, outbound)) => {
                permit.send(Outbound::C2d(Box::new(message)));
                self.note_depth(outbound);
                Ok(())
            }
            None => Err(message),
        };
        handed
    }

    /// Devices (not modules) connected now.
    pub fn connected_devices(&self) -> u64 {
        self.connected_devices.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(super) fn dev(id: &str) -> Identity {
        Identity::for_device(id)
    }

    fn tx() -> mpsc::Sender<Outbound> {
        mpsc::channel(1).0
    }

    #[test]
    fn newer_connection_kicks_older_and_older_cannot_evict_it() {
        let c = Connections::new();
        let first = c.register(&dev("d"), tx());
        let second = c.register(&dev("d"), tx());
        assert!(first.kicked.is_cancelled());
        assert_eq!(first.kick_reason(), Some(KickReason::Replaced));
        assert!(!second.kicked.is_cancelled());
        assert_eq!(c.connected_devices(), 1);
        drop(first);
        assert!(second.is_current());
        assert_eq!(c.connected_devices(), 1);
        drop(second);
        assert_eq!(c.connected_devices(), 0);
    }

    #[test]
    fn kick_device_reaches_modules() {
        let c = Connections::new();
        let d = c.register(&dev("d"), tx());
        let m = c.register(&Identity::for_module("d", "m"), tx());
        let other = c.register(&dev("d2"), tx());
        assert_eq!(c.kick_device(&DeviceId::new("d")), 2);
        assert!(d.kicked.is_cancelled() && m.kicked.is_cancelled() && !other.kicked.is_cancelled());
        assert_eq!(c.connected_devices(), 2);
    }
}

#[cfg(test)]
mod notify_tests {
    use super::tests::dev;
    use super::*;

    #[test]
    fn notify_reaches_the_current_connection_only() {
        let c = Connections::new();
        let (tx1, mut rx1) = mpsc::channel(4);
        let (tx2, mut rx2) = mpsc::channel(1);
        let _a = c.register(&dev("d"), tx1);
        assert!(c.notify(
            &ClientId::new("d"),
            Outbound::DesiredPatch {
                version: 2,
                body: b"{}".to_vec()
            }
        ));
        assert!(rx1.try_recv().is_ok());
        let _b = c.register(&dev("d"), tx2);
        assert!(c.notify(
            &ClientId::new("d"),
            Outbound::DesiredPatch {
                version: 3,
                body: b"{}".to_vec()
            }
        ));
        assert!(
            !c.notify(
                &ClientId::new("d"),
                Outbound::DesiredPatch {
                    version: 4,
                    body: b"{}".to_vec()
                }
            ),
            "queue full: dropped"
        );
        assert!(rx2.try_recv().is_ok() && rx1.try_recv().is_err());
        assert!(!c.notify(
            &ClientId::new("nobody"),
            Outbound::DesiredPatch {
                version: 1,
                body: vec![]
            }
        ));
    }
}

#[cfg(test)]
mod c2d_hand_over_tests {
    use super::tests::dev;
    use super::*;
    use ferrohub_engine::c2d::{C2dMessage, Delivered};
    use ferrohub_engine::UnixMillis;

    fn delivered(token: &str) -> Delivered {
        Delivered {
            sequence: 0,
            lock_token: token.into(),
            delivery_count: 1,
            enqueued: UnixMillis(0),
            expiry: UnixMillis(1),
            message: C2dMessage::default(),
        }
    }

    #[test]
    fn only_a_receiving_device_connection_that_is_not_kicked_receives() {
        let c = Connections::new();
        let id = DeviceId::new("d");
        assert!(!c.receives_c2d(&id), "not connected");
        let r = c.register(&dev("d"), mpsc::channel(1).0);
        assert!(!c.receives_c2d(&id), "connected, not subscribed");
        r.c2d.receiving.store(true, Ordering::Release);
        assert!(c.receives_c2d(&id));
        r.kicked.cancel();
        assert!(!c.receives_c2d(&id), "kicked");
        let m = c.register(&Identity::for_module("d2", "m"), mpsc::channel(1).0);
        m.c2d.receiving.store(true, Ordering::Release);
        assert!(
            !c.receives_c2d(&DeviceId::new("d2")),
            "a module is not its device"
        );
    }

    #[test]
    fn a_hand_over_reaches_the_connection_or_comes_back() {
        let c = Connections::new();
        let id = DeviceId::new("d");
        assert_eq!(c.hand_c2d(&id, delivered("a")).unwrap_err().lock_token, "a");
        let (tx, mut rx) = mpsc::channel(1);
        let _r = c.register(&dev("d"), tx);
        c.hand_c2d(&id, delivered("b")).expect("handed over");
        assert_eq!(
            c.hand_c2d(&id, delivered("c")).unwrap_err().lock_token,
            "c",
            "full"
        );
        match rx.try_recv() {
            Ok(Outbound::C2d(d)) => assert_eq!(d.lock_token, "b"),
            other => panic!("expected the message, got {other:?}"),
        }
        rx.close();
        assert_eq!(
            c.hand_c2d(&id, delivered("d")).unwrap_err().lock_token,
            "d",
            "closed"
        );
    }
}
