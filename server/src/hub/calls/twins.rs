//! Twin writes: the service's patches and replacements (also through the digital twin view),
//! a device's reported patches, and a device's Plug and Play model id.

use ferrohub_engine::model::IfMatch;
use ferrohub_engine::twin::store::{TwinOutcome, TwinWrite};
use ferrohub_engine::{RegistryError, TwinError, UnixMillis};
use serde_json::{Map, Value};

use super::writer_call;

writer_call! {
    /// A service patch (`replace` false) or replacement of a twin's tags and desired section.
    pub struct WriteTwin {
        pub device_id: String,
        pub module_id: Option<String>,
        pub write: TwinWrite,
        pub replace: bool,
        pub if_match: IfMatch,
        pub now: UnixMillis,
    }
    -> Result<TwinOutcome, TwinError>;
    |ctx, c| ctx
        .store
        .run(move |s| {
            let m = c.module_id.as_deref();
            if c.replace {
                s.replace_twin(&c.device_id, m, &c.write, &c.if_match, c.now)
            } else {
                s.update_twin(&c.device_id, m, &c.write, &c.if_match, c.now)
            }
        })
        .await
}

writer_call! {
    /// A JSON Patch of a device's digital twin (PNP-3).
    pub struct PatchDigitalTwin {
        pub device_id: String,
        pub patch: Value,
        pub if_match: IfMatch,
        pub now: UnixMillis,
    }
    -> Result<TwinOutcome, TwinError>;
    |ctx, c| ctx
        .store
        .run(move |s| s.patch_digital_twin(&c.device_id, None, &c.patch, &c.if_match, c.now))
        .await
}

writer_call! {
    /// A device's reported patch; answers the twin's new version. Staged without waiting for
    /// the sync (`Store::patch_reported_then`), so a device's next patch shares it.
    pub struct PatchReported {
        pub device_id: String,
        pub module_id: Option<String>,
        pub patch: Map<String, Value>,
        pub now: UnixMillis,
    }
    -> Result<u64, TwinError>;
    |ctx, c| ctx
        .store
        .run_then(move |s, done| {
            s.patch_reported_then(&c.device_id, c.module_id.as_deref(), &c.patch, c.now, done)
        })
        .await
}

impl PatchReported {
    /// `who`'s reported patch, received at `now`.
    pub fn by(who: &crate::ids::Identity, patch: Map<String, Value>, now: UnixMillis) -> Self {
        PatchReported {
            device_id: who.device_id.to_string(),
            module_id: who.module_id.as_deref().map(str::to_owned),
            patch,
            now,
        }
    }
}

writer_call! {
    /// A connecting device's Plug and Play model id (PNP-1); whether it changed.
    pub struct SetModelId {
        pub device_id: String,
        pub module_id: Option<String>,
        pub model_id: String,
    }
    -> Result<bool, RegistryError>;
    |ctx, c| ctx
        .store
        .run(move |s| s.set_model_id(&c.device_id, c.module_id.as_deref(), &c.model_id))
        .await
}
