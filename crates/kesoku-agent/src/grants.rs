//! The tools' [`Grants`] seam over the store: the connections of one person (an activation's
//! delegation user), read at call time.
//!
//! Nothing here caches or logs a secret: each read goes to the store and the secret goes
//! straight into a [`GrantSecret`], whose `Debug` and `Display` print `[redacted]`.

use std::sync::Arc;

use async_trait::async_trait;
use kesoku_core::{Message, MessageId};
use kesoku_store::{Store, StoreError};
use kesoku_tools::{GrantSecret, Grants};

/// The grants of `user`, as stored with `kesoku grants set`.
pub struct StoreGrants {
    store: Arc<dyn Store>,
    user: String,
}

impl StoreGrants {
    pub fn new(store: Arc<dyn Store>, user: impl Into<String>) -> Self {
        StoreGrants { store, user: user.into() }
    }
}

impl std::fmt::Debug for StoreGrants {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StoreGrants").field("user", &self.user).finish_non_exhaustive()
    }
}

#[async_trait]
impl Grants for StoreGrants {
    fn user(&self) -> &str {
        &self.user
    }

    async fn grant(&self, name: &str) -> Result<Option<GrantSecret>, String> {
        match self.store.grant_secret(&self.user, name).await {
            Ok(secret) => Ok(secret.map(GrantSecret::new)),
            // A store error never carries the secret (it failed before one was read).
            Err(error) => Err(format!("reading grant `{name}` failed: {error}")),
        }
    }
}

/// The delegation user of the turn rooted at `root` (from its `metadata.activation`), `None`
/// when it ran for nobody in particular or is gone.
pub(crate) async fn delegation_user_of(store: &dyn Store, root: &MessageId) -> Result<Option<String>, StoreError> {
    Ok(store.get_message(root).await?.and_then(|message| message.metadata.activation).and_then(|r| r.delegation_user))
}

/// Work a turn starts for later (a follow-up's reminder, a background job's alert) runs for the
/// same person as the turn rooted at `root`: copy its delegation user into `message`'s request.
/// Deterministic (the root never changes), so a retried post stores the same message.
pub(crate) async fn inherit_delegation_user(
    store: &dyn Store,
    root: &MessageId,
    message: &mut Message,
) -> Result<(), StoreError> {
    let user = delegation_user_of(store, root).await?;
    if let Some(request) = message.metadata.activation.as_mut() {
        request.delegation_user = user;
    }
    Ok(())
}
