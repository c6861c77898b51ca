//! Shared access policy changes (the console's policies page): one change at a time, whole
//! settings written by the engine under its hub lock.

use ferrohub_engine::hub::HubSettings;
use ferrohub_engine::policies::PolicyChange;
use ferrohub_engine::HubError;

use super::writer_call;

writer_call! {
    /// Adds a policy, changes its rights, regenerates a key or removes it; the settings now
    /// in force, for the asking node to hold at once.
    pub struct ChangePolicy { pub change: PolicyChange }
    -> Result<HubSettings, HubError>;
    |ctx, c| {
        let settings = ctx.store.run(move |s| s.change_policy(&c.change)).await?;
        ctx.policies.replace(&settings);
        Ok(settings)
    }
}
