//! MQT-9: persistent sessions survive restarts and die with their identity.

mod common;

use ferrohub_engine::model::{IdentitySpec, IfMatch, UnixMillis};
use ferrohub_engine::sessions::{SessionRecord, Subscription};

#[test]
fn sessions_persist_and_die_with_identities() {
    let dir = tempfile::tempdir().unwrap();
    {
        let store = common::open(dir.path());
        store
            .create_device("d", &IdentitySpec::default(), common::T0)
            .unwrap();
        store
            .create_module("d", "m", &IdentitySpec::default(), common::T0)
            .unwrap();
        let mut s = SessionRecord::default();
        s.subscribe([Subscription {
            filter: "devices/d/messages/devicebound/#".into(),
            qos: 1,
        }]);
        s.subscribe([
            Subscription {
                filter: "$iothub/twin/res/#".into(),
                qos: 0,
            },
            Subscription {
                filter: "$iothub/twin/res/#".into(),
                qos: 1,
            },
        ]);
        store.save_session("d", &s).unwrap();
        store.save_session("d/m", &s).unwrap();
        store.close().unwrap();
    }
    let store = common::open(dir.path());
    let s = store.load_session("d").unwrap().unwrap();
    assert_eq!(s.subscriptions.len(), 2);
    assert_eq!(
        s.subscriptions[1],
        Subscription {
            filter: "$iothub/twin/res/#".into(),
            qos: 1
        }
    );
    store
        .delete_module("d", "m", &IfMatch::Any, UnixMillis(0))
        .unwrap();
    assert!(store.load_session("d/m").unwrap().is_none());
    store
        .delete_device("d", &IfMatch::Any, UnixMillis(0))
        .unwrap();
    assert!(store.load_session("d").unwrap().is_none());
}
