//! Twin documents (TWN-1..TWN-7): the rules of a section — limits, merge patches, versions and
//! per-node metadata — as pure functions over JSON. Storing twins with their identities, the REST
//! and MQTT operations and change records come with the twin feature (issue 4).

pub mod document;
pub mod limits;
