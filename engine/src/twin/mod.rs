//! Twin documents (TWN-1..TWN-7): the rules of a section — limits, merge patches, versions and
//! per-node metadata — as pure functions over JSON ([`document`], [`limits`]), the twin as data
//! ([`record`]), twins stored with their identities ([`store`]) and their change bodies
//! ([`changes`]), and the Plug and Play digital twin as a view of a record ([`pnp`]). Imports go
//! one way: `store` → `changes` / `pnp` → `record` → `document`.

pub mod changes;
pub mod configured;
mod digital;
pub mod document;
pub mod limits;
pub mod pnp;
pub mod record;
pub mod store;
