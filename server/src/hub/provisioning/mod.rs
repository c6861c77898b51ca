//! The provisioning service (DPS-1 to DPS-3): a device's registration is attested, assigned by
//! the engine, and answered as an operation the device polls.
//!
//! A registration is assigned while the register request is handled: the answer (`assigning`
//! with an operation id) leaves only once the assignment is durable. The poll then reads the
//! registration state, whose `operation_id` names the operation that wrote it, so a poll is
//! answered by any node and after a restart. Outcomes that write nothing (a disabled
//! enrollment, a refused assignment) are kept in memory for [`OUTCOME_TTL`].
//!
//! # Invariants
//! - Nothing is written for a registration no enabled enrollment admits.
//! - The enrollment used is the one attested: the engine re-checks its etag under its lock
//!   and the registration is attested again if it changed.

mod attest;
mod groups;
mod outcomes;
mod register_body;
mod source_guard;
pub mod status_json;

use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use ferrohub_engine::hub::HubSettings;
use ferrohub_engine::identity::Assignment;
use ferrohub_engine::provisioning::{
    validate_registration_id, EnrollmentKind, ProvisioningError, ProvisioningSettings,
    RegistrationRecord,
};
use ferrohub_engine::StorageError;

pub use attest::{AttestError, Credential};
use attest::{Attested, Candidates};
use groups::GroupIndex;
pub use groups::MAX_SYMMETRIC_TRIES;
use outcomes::Outcomes;
pub use register_body::{parse_register_body, MAX_REGISTER_BODY};
use source_guard::SourceGuard;

use super::store_handle::StoreHandle;
use crate::clock::Clock;

/// How long an outcome that wrote nothing can be polled.
pub const OUTCOME_TTL: Duration = Duration::from_secs(600);
/// The polling interval the answers suggest (`retry-after`), in seconds.
pub const RETRY_AFTER_SECS: u64 = 1;
/// Most enrollment groups read for attestation.
const MAX_GROUPS: usize = 1000;

/// A device's registration request.
#[derive(Debug, Clone)]
pub struct RegisterRequest {
    pub id_scope: String,
    pub registration_id: String,
    pub credential: Credential,
    /// The device's `payload`, JSON.
    pub payload: Option<serde_json::Value>,
    /// The address the request came from (the failed-attestation limit is per source).
    pub source: IpAddr,
}

/// Where an operation stands.
#[derive(Debug, Clone)]
pub enum OperationState {
    Assigning,
    Assigned(Box<RegistrationRecord>),
    Disabled,
    Failed { code: u32, message: String },
}

/// One registration operation, as a device sees it.
#[derive(Debug, Clone)]
pub struct Operation {
    pub operation_id: String,
    pub registration_id: String,
    pub state: OperationState,
}

/// Why a request got no operation: DPS's status, error code and message.
#[derive(Debug, thiserror::Error)]
pub enum DpsFailure {
    #[error("{0}")]
    Unauthorized(String),
    #[error("{0}")]
    BadRequest(String),
    #[error("{0}")]
    NotFound(String),
    #[error("the provisioning service cannot read or write now: {0}")]
    Unavailable(String),
    /// A throttle or the source's failed-attestation limit: 429, try again after the wait.
    #[error("{message}")]
    Throttled {
        message: String,
        retry_after: Duration,
    },
}

impl DpsFailure {
    /// `(HTTP status, DPS error code)`.
    pub fn status_and_code(&self) -> (u16, u32) {
        match self {
            DpsFailure::Unauthorized(_) => (401, 401002),
            DpsFailure::BadRequest(_) => (400, 400004),
            DpsFailure::NotFound(_) => (404, 404201),
            DpsFailure::Unavailable(_) => (503, 503000),
            DpsFailure::Throttled { .. } => (429, 429001),
        }
    }

    /// The `retry-after` the answer carries, in whole seconds (at least 1), where it has one.
    pub fn retry_after_secs(&self) -> Option<u64> {
        match self {
            DpsFailure::Throttled { retry_after, .. } => {
                Some(retry_after.as_secs_f64().ceil().max(1.0) as u64)
            }
            DpsFailure::Unavailable(_) => Some(RETRY_AFTER_SECS),
            _ => None,
        }
    }
}

impl From<StorageError> for DpsFailure {
    fn from(e: StorageError) -> Self {
        DpsFailure::Unavailable(e.to_string())
    }
}

/// An operation id in DPS's shape: `5.{16 hex}.{uuid}`.
fn new_operation_id() -> String {
    let u = rand::random::<u128>().to_be_bytes();
    let hex = |b: &[u8]| b.iter().map(|x| format!("{x:02x}")).collect::<String>();
    format!(
        "5.{:016x}.{}-{}-{}-{}-{}",
        rand::random::<u64>(),
        hex(&u[0..4]),
        hex(&u[4..6]),
        hex(&u[6..8]),
        hex(&u[8..10]),
        hex(&u[10..16])
    )
}

/// The device side of the provisioning service.
#[derive(Clone)]
pub struct Provisioning {
    store: StoreHandle,
    settings: ProvisioningSettings,
    host_name: String,
    clock: Clock,
    outcomes: Arc<Outcomes>,
    /// The groups as last read, for the generation they were read at.
    groups: Arc<parking_lot::Mutex<Option<Arc<GroupIndex>>>>,
    sources: Arc<SourceGuard>,
}

impl Provisioning {
    /// `failed_attestations_per_minute`: per source address (0: no limit).
    pub fn new(
        store: StoreHandle,
        hub: &HubSettings,
        clock: Clock,
        failed_attestations_per_minute: u32,
    ) -> Self {
        Provisioning {
            store,
            settings: hub
                .provisioning
                .clone()
                .unwrap_or_else(ProvisioningSettings::generate),
            host_name: hub.host_name.clone(),
            clock,
            outcomes: Arc::new(Outcomes::default()),
            groups: Arc::default(),
            sources: Arc::new(SourceGuard::new(failed_attestations_per_minute)),
        }
    }

    pub fn settings(&self) -> &ProvisioningSettings {
        &self.settings
    }

    pub fn host_name(&self) -> &str {
        &self.host_name
    }

    /// Refuses a source past its failed-attestation budget, then checks the request names this
    /// service and a valid registration id.
    fn check_target(&self, request: &RegisterRequest) -> Result<(), DpsFailure> {
        if let Some(wait) = self.sources.refused_for(request.source) {
            return Err(DpsFailure::Throttled {
                message: "ThrottlingException: too many failed attestations from this address"
                    .into(),
                retry_after: wait,
            });
        }
        if !request
            .id_scope
            .eq_ignore_ascii_case(&self.settings.id_scope)
        {
            self.sources.failed(request.source);
            return Err(DpsFailure::Unauthorized(format!(
                "ID scope {:?} is not this provisioning service's",
                request.id_scope
            )));
        }
        validate_registration_id("registrationId", &request.registration_id)
            .map_err(|e| DpsFailure::BadRequest(e.to_string()))
    }

    async fn attest(&self, request: &RegisterRequest) -> Result<Attested, DpsFailure> {
        let rid = request.registration_id.clone();
        let cached = self.groups.lock().clone();
        let wants_cas = matches!(request.credential, Credential::Certificate(_));
        let (individual, index, admitted_before, hub_cas) = self
            .store
            .run(move |s| {
                let individual = match s.get_enrollment(EnrollmentKind::Individual, &rid) {
                    Ok(e) => Some(e),
                    Err(ProvisioningError::Storage(e)) => return Err(e),
                    Err(_) => None,
                };
                if individual.is_some() {
                    return Ok((individual, None, None, Vec::new()));
                }
                let generation = s.enrollment_groups_generation()?;
                let index = match cached {
                    Some(index) if index.generation == generation => index,
                    _ => Arc::new(GroupIndex::build(
                        generation,
                        s.list_enrollments(EnrollmentKind::Group, None, MAX_GROUPS)?
                            .items,
                    )),
                };
                let admitted_before = match s.get_registration(&rid) {
                    Ok(r) if r.enrollment_kind == EnrollmentKind::Group => Some(r.enrollment_id),
                    Err(ProvisioningError::Storage(e)) => return Err(e),
                    _ => None,
                };
                let hub_cas = if wants_cas {
                    s.list_certificate_authorities()
                        .map_err(|e| StorageError::Backend(e.to_string()))?
                } else {
                    Vec::new()
                };
                Ok((individual, Some(index), admitted_before, hub_cas))
            })
            .await?;
        let groups = match &index {
            None => Vec::new(),
            Some(index) => {
                *self.groups.lock() = Some(Arc::clone(index));
                match &request.credential {
                    Credential::Sas(_) => index.symmetric_candidates(admitted_before.as_deref()),
                    Credential::Certificate(chain) => index.x509_candidates(chain, &hub_cas),
                }
            }
        };
        attest::attest(
            &request.credential,
            &self.settings.id_scope,
            &request.registration_id,
            Candidates {
                individual,
                groups,
                hub_cas,
            },
            self.clock.now_secs(),
        )
        .map_err(|e: AttestError| {
            self.sources.failed(request.source);
            tracing::info!(registration = %request.registration_id, source = %request.source, error = %e, "registration refused");
            DpsFailure::Unauthorized(e.to_string())
        })
    }

    /// Registers a device: attests it and assigns it (durably) before answering.
    ///
    /// # Errors
    /// [`DpsFailure`]: unauthorized (nothing admits it), a malformed request, storage.
    pub async fn register(
        &self,
        ctx: &super::HubContext,
        request: RegisterRequest,
    ) -> Result<Operation, DpsFailure> {
        self.check_target(&request)?;
        // A registration is a device connection to come: it passes the same throttle (THR-1).
        if let Err(t) = ctx
            .throttles
            .admit(super::throttle::Operation::DeviceConnection)
            .await
        {
            return Err(DpsFailure::Throttled {
                message: "ThrottlingException: the device connection throttle is exceeded".into(),
                retry_after: t.retry_after,
            });
        }
        let operation_id = new_operation_id();
        let payload = request
            .payload
            .as_ref()
            .filter(|p| !p.is_null())
            .map(|p| p.to_string());
        // An enrollment changed between attestation and assignment is attested again, once.
        let mut tries = 0;
        let state = loop {
            tries += 1;
            let attested = self.attest(&request).await?;
            let enrollment_id = attested.enrollment.id.clone();
            let assignment = Assignment {
                enrollment_kind: attested.enrollment.kind,
                enrollment_id: enrollment_id.clone(),
                enrollment_etag: attested.enrollment.etag.clone(),
                registration_id: request.registration_id.clone(),
                credentials: attested.credentials,
                payload: payload.clone(),
                operation_id: operation_id.clone(),
                assigned_hub: self.host_name.clone(),
            };
            let now = self.clock.now();
            let result = ctx
                .write(super::calls::AssignRegistration { assignment, now })
                .await;
            match result {
                Ok(record) => break OperationState::Assigned(Box::new(record)),
                Err(ProvisioningError::EnrollmentChanged(_)) if tries < 2 => continue,
                Err(ProvisioningError::EnrollmentChanged(id)) => {
                    break OperationState::Failed {
                        code: 409000,
                        message: format!("enrollment {id} kept changing; register again"),
                    }
                }
                Err(ProvisioningError::EnrollmentDisabled(_)) => break OperationState::Disabled,
                Err(ProvisioningError::Storage(e))
                | Err(ProvisioningError::Registry(ferrohub_engine::RegistryError::Storage(e))) => {
                    return Err(e.into())
                }
                Err(e) => {
                    break OperationState::Failed {
                        code: 400004,
                        message: e.to_string(),
                    }
                }
            }
        };
        tracing::info!(registration = %request.registration_id, operation = %operation_id, state = ?state, "registration handled");
        if !matches!(state, OperationState::Assigned(_)) {
            self.outcomes.put(
                operation_id.clone(),
                request.registration_id.clone(),
                state,
                self.clock.now(),
            );
        }
        Ok(Operation {
            operation_id,
            registration_id: request.registration_id,
            state: OperationState::Assigning,
        })
    }

    /// The state of operation `operation_id` of a registration; the caller proves itself again.
    ///
    /// # Errors
    /// [`DpsFailure`]: unauthorized, an unknown operation (404), storage.
    pub async fn operation_status(
        &self,
        request: RegisterRequest,
        operation_id: &str,
    ) -> Result<Operation, DpsFailure> {
        self.check_target(&request)?;
        if let Some(state) =
            self.outcomes
                .get(operation_id, &request.registration_id, self.clock.now())
        {
            self.attest(&request).await?;
            return Ok(Operation {
                operation_id: operation_id.to_string(),
                registration_id: request.registration_id,
                state,
            });
        }
        self.attest(&request).await?;
        let record = self.registration(&request.registration_id).await?;
        match record {
            Some(r) if r.operation_id == operation_id => Ok(Operation {
                operation_id: operation_id.to_string(),
                registration_id: request.registration_id,
                state: OperationState::Assigned(Box::new(r)),
            }),
            _ => Err(DpsFailure::NotFound(format!(
                "operation {operation_id} of registration {} not found",
                request.registration_id
            ))),
        }
    }

    /// The registration state of a registration id (the device's status lookup).
    ///
    /// # Errors
    /// [`DpsFailure`]: unauthorized, not found, storage.
    pub async fn registration_status(
        &self,
        request: RegisterRequest,
    ) -> Result<RegistrationRecord, DpsFailure> {
        self.check_target(&request)?;
        self.attest(&request).await?;
        self.registration(&request.registration_id)
            .await?
            .ok_or_else(|| {
                DpsFailure::NotFound(format!(
                    "registration {} not found",
                    request.registration_id
                ))
            })
    }

    async fn registration(&self, id: &str) -> Result<Option<RegistrationRecord>, DpsFailure> {
        let id = id.to_string();
        let found = self
            .store
            .run(move |s| Ok::<_, StorageError>(s.get_registration(&id)))
            .await?;
        match found {
            Ok(r) => Ok(Some(r)),
            Err(ProvisioningError::Storage(e)) => Err(e.into()),
            Err(_) => Ok(None),
        }
    }
}
