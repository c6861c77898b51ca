//! Twin documents (TWN-1..TWN-7): the rules of a section — limits, merge patches, versions and
//! per-node metadata — as pure functions over JSON ([`document`], [`limits`]), and twins stored
//! with their identities ([`store`]).

pub mod changes;
pub mod document;
pub mod limits;
pub mod store;
