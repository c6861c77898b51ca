//! EVT-6 at the engine level: custom endpoints as more partitioned streams, events appended to
//! several endpoints atomically, and the router's cursor over the notification outbox.

mod common;

use ferrohub_engine::d2c::{D2cError, NewEvent, ReadPosition};
use ferrohub_engine::model::{IdentitySpec, UnixMillis};

fn ev(device: &str, body: &str) -> NewEvent {
    NewEvent {
        device_id: device.into(),
        body: body.as_bytes().to_vec(),
        ..NewEvent::default()
    }
}

#[test]
fn events_go_to_every_endpoint_named_and_nowhere_when_none() {
    let dir = tempfile::tempdir().unwrap();
    let store = common::open(dir.path());
    let builtin = store.endpoint_slot("events").unwrap();
    let hot = store.create_endpoint("hot", 2, UnixMillis(0)).unwrap();
    assert!(hot.slot.base >= builtin.partitions);
    assert!(matches!(
        store.create_endpoint("hot", 2, UnixMillis(0)),
        Err(D2cError::EndpointExists(_))
    ));
    assert!(store.create_endpoint("events", 2, UnixMillis(0)).is_err());
    assert!(store.create_endpoint("bad name", 2, UnixMillis(0)).is_err());
    assert!(store.create_endpoint("zero", 0, UnixMillis(0)).is_err());

    let mut both = ev("d1", "both");
    both.endpoints = Some(vec![builtin, hot.slot]);
    let mut nowhere = ev("d1", "nowhere");
    nowhere.endpoints = Some(vec![]);
    let appended = store
        .append_events(vec![both, nowhere, ev("d1", "default")], UnixMillis(5))
        .unwrap();
    assert_eq!(
        appended.len(),
        3,
        "two copies of the first, none of the second, one default"
    );

    let bp = builtin.partition_of("d1");
    let hp = hot.slot.partition_of("d1");
    let in_builtin: Vec<Vec<u8>> = store
        .read_events(bp, ReadPosition::Start, 10)
        .unwrap()
        .into_iter()
        .map(|e| e.body)
        .collect();
    assert_eq!(in_builtin, vec![b"both".to_vec(), b"default".to_vec()]);
    let in_hot = store.read_events(hp, ReadPosition::Start, 10).unwrap();
    assert_eq!(in_hot.len(), 1);
    assert_eq!(in_hot[0].body, b"both");
    assert_eq!(
        in_hot[0].sequence_number, 0,
        "each endpoint numbers its own partitions"
    );

    store.delete_endpoint("hot").unwrap();
    assert!(store.endpoint_slot("hot").is_none());
    assert!(matches!(
        store.read_events(hp, ReadPosition::Start, 10),
        Err(D2cError::NoSuchPartition(_))
    ));
    assert!(matches!(
        store.delete_endpoint("hot"),
        Err(D2cError::NoSuchEndpoint(_))
    ));

    // A copy routed to the deleted endpoint's slot is dropped, not written where a later
    // endpoint would find it.
    let mut stale = ev("d1", "stale");
    stale.endpoints = Some(vec![hot.slot, builtin]);
    let appended = store.append_events(vec![stale], UnixMillis(6)).unwrap();
    assert_eq!(appended.len(), 1);
    assert_eq!(appended[0].partition, bp);
    let reused = store.create_endpoint("reused", 2, UnixMillis(7)).unwrap();
    assert_eq!(
        (reused.slot.base, reused.slot.partitions),
        (hot.slot.base, hot.slot.partitions),
        "the freed range is reused"
    );
    assert_ne!(reused.slot, hot.slot, "but the slot is another endpoint's");
    let mut late = ev("d1", "late");
    late.endpoints = Some(vec![hot.slot]);
    store.append_events(vec![late], UnixMillis(8)).unwrap();
    assert!(store
        .read_events(reused.slot.partition_of("d1"), ReadPosition::Start, 10)
        .unwrap()
        .is_empty());
}

#[test]
fn endpoints_survive_a_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let slot = {
        let store = common::open(dir.path());
        let e = store.create_endpoint("cold", 3, UnixMillis(0)).unwrap();
        let mut x = ev("d", "x");
        x.endpoints = Some(vec![e.slot]);
        store.append_events(vec![x], UnixMillis(1)).unwrap();
        store.close().unwrap();
        e.slot
    };
    let store = common::open(dir.path());
    assert_eq!(store.endpoint_slot("cold"), Some(slot));
    assert_eq!(store.list_endpoints().len(), 1);
    let got = store
        .read_events(slot.partition_of("d"), ReadPosition::Start, 10)
        .unwrap();
    assert_eq!(got[0].body, b"x");
}

#[test]
fn routing_notifications_moves_the_cursor_and_numbering_continues_after_reopen() {
    let dir = tempfile::tempdir().unwrap();
    {
        let store = common::open(dir.path());
        for i in 0..3 {
            store
                .create_device(&format!("d{i}"), &IdentitySpec::default(), UnixMillis(i))
                .unwrap();
        }
        let notes = store.read_notifications(0, 10).unwrap();
        assert_eq!(notes.len(), 3);
        assert_eq!(store.router_cursor().unwrap(), 0);
        let routed: Vec<NewEvent> = notes.iter().map(|n| ev(&n.device_id, "note")).collect();
        store
            .append_routed_notifications(routed, UnixMillis(10), &[0, 1, 2])
            .unwrap();
        assert_eq!(store.router_cursor().unwrap(), 3);
        assert!(
            store.read_notifications(0, 10).unwrap().is_empty(),
            "routed ones are gone"
        );
        store.close().unwrap();
    }
    let store = common::open(dir.path());
    store
        .create_device("later", &IdentitySpec::default(), UnixMillis(20))
        .unwrap();
    let notes = store.read_notifications(0, 10).unwrap();
    assert_eq!(notes.len(), 1);
    assert_eq!(
        notes[0].sequence, 3,
        "numbering continues past the routed records"
    );
}

fn hook(url: &str) -> ferrohub_engine::delivery::DeliveryTarget {
    ferrohub_engine::delivery::DeliveryTarget::Webhook(ferrohub_engine::delivery::WebhookTarget {
        url: url.into(),
        signing_key: "c2l4dGVlbiBieXRlcyBrZXk=".into(),
        ca_certificate: None,
        timeout_ms: 5_000,
        dead_letter_after_ms: 60_000,
    })
}

#[test]
fn a_delivered_endpoint_keeps_its_target_and_cursors_until_it_goes() {
    let dir = tempfile::tempdir().unwrap();
    {
        let store = common::open(dir.path());
        let e = store
            .create_endpoint_delivering("out", 2, Some(hook("https://r/1")), UnixMillis(0))
            .unwrap();
        assert_eq!(e.delivery, Some(hook("https://r/1")));
        let p = e.slot.base + 1;
        assert_eq!(store.delivery_cursor("out", p).unwrap(), 0);
        store.advance_delivery_cursor("out", p, 7).unwrap();
        // A cursor never moves back.
        store.advance_delivery_cursor("out", p, 3).unwrap();
        assert_eq!(store.delivery_cursor("out", p).unwrap(), 7);
        // Not a partition of the endpoint, or an endpoint without a target: refused.
        assert!(store.advance_delivery_cursor("out", 0, 1).is_err());
        store.create_endpoint("plain", 1, UnixMillis(0)).unwrap();
        let plain = store.endpoint_slot("plain").unwrap().base;
        assert!(matches!(
            store.advance_delivery_cursor("plain", plain, 1),
            Err(D2cError::NoSuchEndpoint(_))
        ));
        // A bad target is refused with its field, and nothing is stored.
        let mut bad = hook("ftp://r/");
        assert!(matches!(
            store.create_endpoint_delivering("bad", 1, Some(bad.clone()), UnixMillis(0)),
            Err(D2cError::Invalid(_))
        ));
        let ferrohub_engine::delivery::DeliveryTarget::Webhook(w) = &mut bad else {
            unreachable!("made as a webhook")
        };
        w.url = "https://r/".into();
        w.signing_key = "c2hvcnQ=".into();
        assert!(store.set_endpoint_delivery("plain", Some(bad)).is_err());
        assert!(store.endpoint_slot("bad").is_none());
        // The target changes without touching the cursor.
        store
            .set_endpoint_delivery("out", Some(hook("https://r/2")))
            .unwrap();
        assert_eq!(store.delivery_cursor("out", p).unwrap(), 7);
    }
    // Stored across a reopen.
    let store = common::open(dir.path());
    let out = store
        .list_endpoints()
        .into_iter()
        .find(|e| e.name == "out")
        .unwrap();
    assert_eq!(out.delivery, Some(hook("https://r/2")));
    let p = out.slot.base + 1;
    assert_eq!(store.delivery_cursor("out", p).unwrap(), 7);
    // Removing the target forgets the cursors; deleting the endpoint too.
    store.set_endpoint_delivery("out", None).unwrap();
    assert_eq!(store.delivery_cursor("out", p).unwrap(), 0);
    store
        .set_endpoint_delivery("out", Some(hook("https://r/3")))
        .unwrap();
    store.advance_delivery_cursor("out", p, 4).unwrap();
    store.delete_endpoint("out").unwrap();
    assert_eq!(store.delivery_cursor("out", p).unwrap(), 0);
    assert!(matches!(
        store.set_endpoint_delivery("out", None),
        Err(D2cError::NoSuchEndpoint(_))
    ));
}
