//! Cloud-to-device queue writes: sends, locks (receives), settles, purges; the feedback and
//! file-notification queues. Each call tells the writer's deadline tasks of the deadlines it
//! stored (`super::super::c2d::C2d::scheduled`), since those tasks run on the writer only.

use ferrohub_engine::c2d::file_notifications::{FileNotification, LockedFileNotification};
use ferrohub_engine::c2d::{
    C2dError, C2dMessage, Delivered, FeedbackMessage, Settle, Settled, TimerKind,
};
use ferrohub_engine::{StorageError, UnixMillis};

use super::writer_call;
use crate::hub::HubContext;

/// Tells the lock deadline task that messages were locked at `at`.
fn locked_at(ctx: &HubContext, at: UnixMillis) {
    let lock_for = ctx.c2d.settings.lock_timeout_ms;
    ctx.c2d
        .scheduled(TimerKind::Lock, UnixMillis(at.0.saturating_add(lock_for)));
}

writer_call! {
    /// Queues a message (C2D-1). With `lock_for_receiver` (the device's connection is
    /// receiving, on the asking node or one it asked) a message sent to an empty queue is locked for it in the
    /// same commit and comes back, to be handed over.
    pub struct SendC2d {
        pub device_id: String,
        pub message: C2dMessage,
        pub lock_for_receiver: bool,
        pub now: UnixMillis,
    }
    -> Result<Option<Delivered>, C2dError>;
    |ctx, c| {
        let settings = ctx.c2d.settings;
        let (id, message, at) = (c.device_id, c.message, c.now);
        let (sent, delivered) = if c.lock_for_receiver {
            ctx.store
                .run_then(move |s, done| {
                    s.send_c2d_locked_then(&id, message.clone(), at, &settings, done)
                })
                .await?
        } else {
            let sent = ctx
                .store
                .run_then(move |s, done| s.send_c2d_then(&id, message.clone(), at, &settings, done))
                .await?;
            (sent, None)
        };
        ctx.c2d.scheduled(TimerKind::Expiry, sent.expiry);
        if delivered.is_some() {
            // Counted where the lock is made, so a cluster's writer counts every node's.
            metrics::counter!("ferrohub_c2d_locked_on_send_total").increment(1);
            locked_at(&ctx, at);
        }
        Ok(delivered)
    }
}

writer_call! {
    /// `DELETE /devices/{id}/commands`: how many messages went.
    pub struct PurgeC2d { pub device_id: String }
    -> Result<u32, C2dError>;
    |ctx, c| ctx
        .store
        .run(move |s| {
            s.get_device(&c.device_id).map_err(|e| match e {
                ferrohub_engine::RegistryError::Storage(e) => C2dError::Storage(e),
                _ => C2dError::DeviceNotFound(c.device_id.clone()),
            })?;
            s.purge_c2d(&c.device_id)
        })
        .await
}

writer_call! {
    /// Locks up to `max` deliverable messages of a device's queue.
    pub struct ReceiveC2d { pub device_id: String, pub max: usize, pub now: UnixMillis }
    -> Result<Vec<Delivered>, C2dError>;
    |ctx, c| {
        let (settings, at) = (ctx.c2d.settings, c.now);
        let (id, max) = (c.device_id, c.max);
        let got = ctx
            .store
            .run_then(move |s, done| s.receive_c2d_then(&id, max, at, &settings, done))
            .await?;
        if !got.is_empty() {
            locked_at(&ctx, at);
        }
        Ok(got)
    }
}

writer_call! {
    /// Completes a message and locks up to `max` more in one commit.
    pub struct CompleteAndReceiveC2d {
        pub device_id: String,
        pub lock_token: String,
        pub max: usize,
        pub now: UnixMillis,
    }
    -> Result<Vec<Delivered>, C2dError>;
    |ctx, c| {
        let (settings, at, max) = (ctx.c2d.settings, c.now, c.max);
        let (id, token) = (c.device_id, c.lock_token);
        let got = ctx
            .store
            .run_then(move |s, done| {
                s.complete_and_receive_c2d_then(&id, &token, max, at, &settings, done)
            })
            .await?;
        if !got.is_empty() {
            locked_at(&ctx, at);
        }
        Ok(got)
    }
}

writer_call! {
    /// Completes, rejects or abandons a locked message.
    pub struct SettleC2d {
        pub device_id: String,
        pub lock_token: String,
        pub action: Settle,
        pub now: UnixMillis,
    }
    -> Result<Settled, C2dError>;
    |ctx, c| {
        let settings = ctx.c2d.settings;
        ctx.store
            .run_then(move |s, done| {
                s.settle_c2d_then(&c.device_id, &c.lock_token, c.action, c.now, &settings, done)
            })
            .await
    }
}

writer_call! {
    /// Locks the next feedback message (C2D-5) for a back-end, if there is one.
    pub struct ReceiveFeedback { pub now: UnixMillis }
    -> Result<Option<FeedbackMessage>, StorageError>;
    |ctx, c| {
        let (settings, at) = (ctx.c2d.settings, c.now);
        let got = ctx
            .store
            .run(move |s| s.receive_feedback(at, &settings))
            .await?;
        if let Some(f) = &got {
            locked_at(&ctx, at);
            ctx.c2d.scheduled(
                TimerKind::Expiry,
                UnixMillis(f.enqueued.0.saturating_add(settings.feedback_ttl_ms)),
            );
        }
        Ok(got)
    }
}

writer_call! {
    pub struct SettleFeedback { pub lock_token: String, pub action: Settle, pub now: UnixMillis }
    -> Result<Settled, C2dError>;
    |ctx, c| {
        let settings = ctx.c2d.settings;
        ctx.store
            .run(move |s| s.settle_feedback(&c.lock_token, c.action, c.now, &settings))
            .await
    }
}

/// The file-notification queue's settings: those of the writer's storage account section.
fn file_settings(
    ctx: &HubContext,
) -> Result<ferrohub_engine::c2d::file_notifications::FileNotificationSettings, StorageError> {
    ctx.uploads
        .as_ref()
        .map(|u| u.notification_settings)
        .ok_or_else(|| StorageError::Backend("file upload is not configured on the writer".into()))
}

writer_call! {
    /// A device's report of a finished upload, queued for back-ends (FUP-3).
    pub struct EnqueueFileNotification { pub notification: FileNotification, pub now: UnixMillis }
    -> Result<(), StorageError>;
    |ctx, c| {
        let settings = file_settings(&ctx)?;
        ctx.store
            .run(move |s| s.enqueue_file_notification(c.notification, c.now, &settings))
            .await
    }
}

writer_call! {
    pub struct ReceiveFileNotification { pub now: UnixMillis }
    -> Result<Option<LockedFileNotification>, StorageError>;
    |ctx, c| {
        let settings = file_settings(&ctx)?;
        ctx.store
            .run(move |s| s.receive_file_notification(c.now, &settings))
            .await
    }
}

writer_call! {
    pub struct SettleFileNotification {
        pub lock_token: String,
        pub action: Settle,
        pub now: UnixMillis,
    }
    -> Result<Settled, C2dError>;
    |ctx, c| ctx
        .store
        .run(move |s| s.settle_file_notification(&c.lock_token, c.action, c.now))
        .await
}
