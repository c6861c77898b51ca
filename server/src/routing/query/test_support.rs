//! Test fixtures shared by the query module's tests: a message as the router would present
//! it, and helpers that parse, evaluate and assert conditions.

use std::borrow::Cow;
use std::collections::HashMap;

use serde_json::{json, Value};

use super::{Condition, MessageView};

/// A message as the router would present it.
#[derive(Default)]
pub(super) struct TestMessage {
    system: HashMap<String, Value>,
    app: HashMap<String, Value>,
    body: Option<Value>,
    twin: Option<Value>,
}

impl TestMessage {
    pub(super) fn sys(mut self, name: &str, value: impl Into<Value>) -> Self {
        self.system.insert(name.to_string(), value.into());
        self
    }

    pub(super) fn app(mut self, name: &str, value: impl Into<Value>) -> Self {
        self.app.insert(name.to_string(), value.into());
        self
    }

    pub(super) fn body(mut self, body: Value) -> Self {
        self.body = Some(body);
        self
    }

    pub(super) fn twin(mut self, twin: Value) -> Self {
        self.twin = Some(twin);
        self
    }
}

impl MessageView for TestMessage {
    fn system_property(&self, name: &str) -> Option<Value> {
        self.system.get(name).cloned()
    }

    fn application_property(&self, name: &str) -> Option<Value> {
        self.app.get(name).cloned()
    }

    fn body(&self) -> Option<&Value> {
        self.body.as_ref()
    }

    fn twin(&self, path: &[String]) -> Option<Value> {
        let mut value = self.twin.as_ref()?;
        for name in path {
            value = value.get(name.as_str())?;
        }
        Some(value.clone())
    }
}

pub(super) fn sample() -> TestMessage {
    TestMessage::default()
        .sys("contentType", "application/json")
        .sys("contentEncoding", "utf-8")
        .sys("messageId", "m-1")
        .sys("connectionDeviceId", "thermo-1")
        .sys("iothub-connection-device-id", "thermo-1")
        .app("level", "critical")
        .app("temp", "35")
        .app("iothub-message-schema", "temperature")
        .app("Empty", "")
        .body(json!({
            "temperature": 31.5,
            "humidity": 40,
            "count": 3,
            "ok": true,
            "nothing": null,
            "name": "  Sensor Ünit  ",
            "weather": {"wind": {"speed": 12}, "sky": "clear"},
            "readings": [10, 20, {"v": 30}],
            "odd keys": {"key with space": "yes"},
        }))
        .twin(json!({
            "tags": {"location": "west", "floor": 3},
            "properties": {"reported": {"fw": "1.2.0", "sensors": ["a", "b"]}},
        }))
}

pub(super) fn parse(text: &str) -> Condition {
    Condition::parse(text).unwrap_or_else(|e| panic!("{text:?} should parse: {e}"))
}

pub(super) fn eval(text: &str, message: &TestMessage) -> Option<Value> {
    let condition = parse(text);
    condition.expr.eval(message).map(Cow::into_owned)
}

pub(super) fn error(text: &str) -> String {
    match Condition::parse(text) {
        Ok(c) => panic!("{text:?} should not parse, got {c:?}"),
        Err(e) => e.to_string(),
    }
}

#[track_caller]
pub(super) fn assert_all(message: &TestMessage, matching: &[&str], not_matching: &[&str]) {
    for text in matching {
        assert!(parse(text).matches(message), "{text:?} should match");
    }
    for text in not_matching {
        assert!(!parse(text).matches(message), "{text:?} should not match");
    }
}
