//! Registry writes: devices, modules, bulk changes and X.509 CA certificates.

use ferrohub_engine::hub::CertificateAuthority;
use ferrohub_engine::identity::{BulkItem, BulkItemError};
use ferrohub_engine::model::{Identity, IdentitySpec, IfMatch};
use ferrohub_engine::{HubError, RegistryError, UnixMillis};

use super::writer_call;

writer_call! {
    pub struct CreateDevice { pub device_id: String, pub spec: IdentitySpec, pub now: UnixMillis }
    -> Result<Identity, RegistryError>;
    |ctx, c| ctx.store.run(move |s| s.create_device(&c.device_id, &c.spec, c.now)).await
}

writer_call! {
    pub struct UpdateDevice {
        pub device_id: String,
        pub spec: IdentitySpec,
        pub if_match: IfMatch,
        pub now: UnixMillis,
    }
    -> Result<Identity, RegistryError>;
    |ctx, c| ctx
        .store
        .run(move |s| s.update_device(&c.device_id, &c.spec, &c.if_match, c.now))
        .await
}

writer_call! {
    pub struct CreateModule {
        pub device_id: String,
        pub module_id: String,
        pub spec: IdentitySpec,
        pub now: UnixMillis,
    }
    -> Result<Identity, RegistryError>;
    |ctx, c| ctx
        .store
        .run(move |s| s.create_module(&c.device_id, &c.module_id, &c.spec, c.now))
        .await
}

writer_call! {
    pub struct UpdateModule {
        pub device_id: String,
        pub module_id: String,
        pub spec: IdentitySpec,
        pub if_match: IfMatch,
    }
    -> Result<Identity, RegistryError>;
    |ctx, c| ctx
        .store
        .run(move |s| s.update_module(&c.device_id, &c.module_id, &c.spec, &c.if_match))
        .await
}

writer_call! {
    /// Deletes a device (`module_id` `None`, with its modules) or one module.
    pub struct DeleteIdentity {
        pub device_id: String,
        pub module_id: Option<String>,
        pub if_match: IfMatch,
        pub now: UnixMillis,
    }
    -> Result<(), RegistryError>;
    |ctx, c| ctx
        .store
        .run(move |s| match &c.module_id {
            None => s.delete_device(&c.device_id, &c.if_match, c.now),
            Some(m) => s.delete_module(&c.device_id, m, &c.if_match, c.now),
        })
        .await
}

writer_call! {
    /// `POST /devices`: the items that failed, each with why.
    pub struct BulkIdentities { pub items: Vec<BulkItem>, pub now: UnixMillis }
    -> Result<Vec<BulkItemError>, RegistryError>;
    |ctx, c| ctx.store.run(move |s| s.bulk(&c.items, c.now)).await
}

writer_call! {
    pub struct PutCertificate { pub ca: CertificateAuthority }
    -> Result<(), HubError>;
    |ctx, c| ctx.store.run(move |s| s.put_certificate_authority(&c.ca)).await
}

writer_call! {
    /// Whether there was one.
    pub struct DeleteCertificate { pub name: String }
    -> Result<bool, HubError>;
    |ctx, c| ctx.store.run(move |s| s.delete_certificate_authority(&c.name)).await
}
