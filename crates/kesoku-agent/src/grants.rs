//! The tools' [`Grants`] seam over the store: the connections of one person (an activation's
//! delegation user), read at call time.
//!
//! Nothing here caches or logs a secret: each read goes to the store and the secret goes
//! straight into a [`GrantSecret`], whose `Debug` and `Display` print `[redacted]`.

use std::sync::Arc;

use async_trait::async_trait;
use kesoku_store::Store;
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
