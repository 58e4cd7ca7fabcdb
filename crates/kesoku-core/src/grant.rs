//! Grants: a person's connection to an outside service (a token stored per user with `kesoku
//! grants`), as far as the vocabulary goes. The secret itself never travels in these types:
//! [`GrantInfo`] is what listings show, and the one check of what a grant name may be lives here.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

/// The longest grant name accepted.
pub const GRANT_NAME_MAX: usize = 64;

/// A stored grant as listings show it: whose, which, and when; never the secret.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GrantInfo {
    /// The person it belongs to (free text: `alice`, `discord:1234`).
    pub user_id: String,
    /// The connection's name (`github`, `drive`), see [`check_grant_name`].
    pub name: String,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

/// Why a grant's user or name was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GrantKeyError {
    #[error("grant name `{0}` is not valid: use 1 to 64 characters of a-z, 0-9, `_` and `-`")]
    BadName(String),
    #[error("a grant's user id must not be empty")]
    EmptyUser,
}

/// The one check of a grant name: `[a-z0-9_-]{1,64}`.
pub fn check_grant_name(name: &str) -> Result<(), GrantKeyError> {
    let allowed = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_' || c == '-';
    if name.is_empty() || name.len() > GRANT_NAME_MAX || !name.chars().all(allowed) {
        return Err(GrantKeyError::BadName(name.chars().take(80).collect()));
    }
    Ok(())
}

/// The check of a grant's (user, name) key: a non-empty user and a valid name.
pub fn check_grant_key(user_id: &str, name: &str) -> Result<(), GrantKeyError> {
    if user_id.trim().is_empty() {
        return Err(GrantKeyError::EmptyUser);
    }
    check_grant_name(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grant_names_are_short_lowercase_words() {
        for good in ["github", "drive_2", "my-api", "a", &"x".repeat(64)] {
            assert_eq!(check_grant_name(good), Ok(()), "{good}");
        }
        for bad in ["", "GitHub", "has space", "dot.ted", "é", &"x".repeat(65)] {
            assert!(matches!(check_grant_name(bad), Err(GrantKeyError::BadName(_))), "{bad}");
        }
        assert_eq!(check_grant_key(" ", "github"), Err(GrantKeyError::EmptyUser));
        assert_eq!(check_grant_key("discord:1234", "github"), Ok(()));
    }
}
