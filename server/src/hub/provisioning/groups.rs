//! The enrollment groups as attestation reads them: read once per change, and narrowed to the
//! few a registration can match before any key is derived or any chain verified.
//!
//! - The index is kept between registrations and rebuilt when the store's groups generation
//!   (one read per registration) differs from the one it was built at; a group written on any
//!   node changes the generation in the same commit, so it is used at once.
//! - Symmetric-key groups: a registration tries the group its registration state names (the
//!   one that admitted it before) first, then the others in id order, at most
//!   [`MAX_SYMMETRIC_TRIES`] in all: two HMACs each, so a failing registration costs a bounded
//!   amount of CPU however many groups there are.
//! - X.509 groups: only those whose signing certificate, or referenced hub CA, has as its
//!   subject the issuer of a certificate in the presented chain (or an intermediate's own
//!   subject), in id order. Names are compared as DER bytes.

use std::collections::{BTreeSet, HashMap, HashSet};

use ferrohub_engine::hub::CertificateAuthority;
use ferrohub_engine::provisioning::{Attestation, Enrollment};
use rustls::pki_types::CertificateDer;

use crate::x509::subject_and_issuer;

/// Most symmetric-key groups one registration is checked against.
pub const MAX_SYMMETRIC_TRIES: usize = 100;

/// The groups at one generation, indexed for attestation.
pub struct GroupIndex {
    pub generation: u64,
    /// Symmetric-key groups in id order.
    symmetric: Vec<Enrollment>,
    /// X.509 groups in id order.
    x509: Vec<Enrollment>,
    /// Subject of a signing certificate → the X.509 groups holding it.
    by_signer_subject: HashMap<Vec<u8>, Vec<usize>>,
    /// Hub CA name → the X.509 groups referencing it.
    by_ca_reference: HashMap<String, Vec<usize>>,
}

impl GroupIndex {
    /// Indexes `groups` (in id order, as listed) read at `generation`.
    pub fn build(generation: u64, groups: Vec<Enrollment>) -> GroupIndex {
        let mut index = GroupIndex {
            generation,
            symmetric: Vec::new(),
            x509: Vec::new(),
            by_signer_subject: HashMap::new(),
            by_ca_reference: HashMap::new(),
        };
        for group in groups {
            match &group.attestation {
                Attestation::SymmetricKey(_) => index.symmetric.push(group),
                Attestation::X509(x) => {
                    let at = index.x509.len();
                    for der in [&x.primary, &x.secondary].into_iter().flatten() {
                        if let Some((subject, _)) = subject_and_issuer(der) {
                            index.by_signer_subject.entry(subject).or_default().push(at);
                        }
                    }
                    for name in [&x.ca_reference_primary, &x.ca_reference_secondary]
                        .into_iter()
                        .flatten()
                    {
                        index
                            .by_ca_reference
                            .entry(name.clone())
                            .or_default()
                            .push(at);
                    }
                    index.x509.push(group);
                }
            }
        }
        index
    }

    /// The symmetric-key groups to try, the one named first, at most [`MAX_SYMMETRIC_TRIES`].
    pub fn symmetric_candidates(&self, admitted_before: Option<&str>) -> Vec<Enrollment> {
        let first = admitted_before.and_then(|id| self.symmetric.iter().find(|g| g.id == id));
        first
            .into_iter()
            .chain(
                self.symmetric
                    .iter()
                    .filter(|g| Some(g.id.as_str()) != admitted_before),
            )
            .take(MAX_SYMMETRIC_TRIES)
            .cloned()
            .collect()
    }

    /// The X.509 groups whose anchor can have issued a certificate of `chain`, in id order.
    pub fn x509_candidates(
        &self,
        chain: &[CertificateDer<'_>],
        hub_cas: &[CertificateAuthority],
    ) -> Vec<Enrollment> {
        let mut issuers: HashSet<Vec<u8>> = HashSet::new();
        for (i, cert) in chain.iter().enumerate() {
            if let Some((subject, issuer)) = subject_and_issuer(cert.as_ref()) {
                issuers.insert(issuer);
                // An intermediate may itself be the group's signing certificate.
                if i > 0 {
                    issuers.insert(subject);
                }
            }
        }
        let mut found: BTreeSet<usize> = BTreeSet::new();
        for name in &issuers {
            found.extend(
                self.by_signer_subject
                    .get(name)
                    .into_iter()
                    .flatten()
                    .copied(),
            );
        }
        for ca in hub_cas {
            let named = self.by_ca_reference.get(&ca.name);
            if named.is_some()
                && subject_and_issuer(&ca.der).is_some_and(|(s, _)| issuers.contains(&s))
            {
                found.extend(named.into_iter().flatten().copied());
            }
        }
        found.into_iter().map(|i| self.x509[i].clone()).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferrohub_engine::model::{SymmetricKeys, UnixMillis};
    use ferrohub_engine::provisioning::{EnrollmentKind, ReprovisionPolicy, X509Attestation};
    use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair};

    fn group(id: &str, attestation: Attestation) -> Enrollment {
        Enrollment {
            kind: EnrollmentKind::Group,
            id: id.into(),
            attestation,
            device_id: None,
            enabled: true,
            initial_tags: None,
            initial_desired: None,
            iot_edge: false,
            reprovision: ReprovisionPolicy::default(),
            passthrough: "{}".into(),
            created: UnixMillis(0),
            last_updated: UnixMillis(0),
            etag: "e".into(),
        }
    }

    fn sas(id: &str) -> Enrollment {
        group(
            id,
            Attestation::SymmetricKey(SymmetricKeys {
                primary_key: "a".into(),
                secondary_key: "b".into(),
            }),
        )
    }

    fn ca(cn: &str) -> (rcgen::Certificate, KeyPair) {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.distinguished_name.push(DnType::CommonName, cn);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        (params.self_signed(&key).unwrap(), key)
    }

    fn leaf(
        cn: &str,
        issuer: &rcgen::Certificate,
        issuer_key: &KeyPair,
    ) -> CertificateDer<'static> {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.distinguished_name.push(DnType::CommonName, cn);
        params
            .signed_by(&key, issuer, issuer_key)
            .unwrap()
            .der()
            .clone()
    }

    #[test]
    fn symmetric_candidates_put_the_previous_group_first_and_are_bounded() {
        let groups: Vec<Enrollment> = (0..150).map(|i| sas(&format!("g{i:03}"))).collect();
        let index = GroupIndex::build(7, groups);
        assert_eq!(index.generation, 7);
        let fresh = index.symmetric_candidates(None);
        assert_eq!(fresh.len(), MAX_SYMMETRIC_TRIES);
        assert_eq!(fresh[0].id, "g000");
        let again = index.symmetric_candidates(Some("g140"));
        assert_eq!(again.len(), MAX_SYMMETRIC_TRIES);
        assert_eq!(
            again[0].id, "g140",
            "the group that admitted it before comes first"
        );
        assert_eq!(again.iter().filter(|g| g.id == "g140").count(), 1);
        assert_eq!(again[1].id, "g000");
        // A group that is gone is simply not tried.
        assert_eq!(index.symmetric_candidates(Some("nope"))[0].id, "g000");
    }

    #[test]
    fn x509_candidates_are_the_groups_whose_anchor_issued_the_chain() {
        let (root_a, key_a) = ca("root A");
        let (root_b, _key_b) = ca("root B");
        let (root_c, key_c) = ca("root C");
        let by_signer = |id: &str, cert: &rcgen::Certificate| {
            group(
                id,
                Attestation::X509(X509Attestation {
                    primary: Some(cert.der().to_vec()),
                    ..X509Attestation::default()
                }),
            )
        };
        let by_reference = group(
            "x-ref-c",
            Attestation::X509(X509Attestation {
                ca_reference_primary: Some("hub-ca-c".into()),
                ..X509Attestation::default()
            }),
        );
        let index = GroupIndex::build(
            1,
            vec![
                sas("s1"),
                by_signer("x-a", &root_a),
                by_signer("x-b", &root_b),
                by_reference,
                by_signer("x-a2", &root_a),
            ],
        );
        let hub_cas = vec![CertificateAuthority {
            name: "hub-ca-c".into(),
            der: root_c.der().to_vec(),
            created: UnixMillis(0),
        }];
        let from_a = [leaf("dev-1", &root_a, &key_a)];
        let ids = |v: Vec<Enrollment>| v.into_iter().map(|e| e.id).collect::<Vec<_>>();
        assert_eq!(
            ids(index.x509_candidates(&from_a, &hub_cas)),
            ["x-a", "x-a2"]
        );
        let from_c = [leaf("dev-2", &root_c, &key_c)];
        assert_eq!(ids(index.x509_candidates(&from_c, &hub_cas)), ["x-ref-c"]);
        assert!(index.x509_candidates(&from_c, &[]).is_empty());
        assert!(index
            .x509_candidates(&[CertificateDer::from(vec![1, 2, 3])], &hub_cas)
            .is_empty());
    }
}
