//! Grants: a secret per (user, name), replaced in place, listed without the secret, removed;
//! keys checked before anything is written.

use std::time::Duration;

use kesoku_core::GrantInfo;
use kesoku_store::StoreError;

use crate::backend_tests;
use crate::harness::{Backend, t0};

backend_tests!(
    a_grant_is_kept_per_user_and_name_replaced_in_place_and_removed,
    grants_are_listed_without_secrets_per_user_or_all,
    a_bad_grant_name_or_empty_user_is_refused_and_nothing_is_written,
);

async fn a_grant_is_kept_per_user_and_name_replaced_in_place_and_removed(b: &Backend) {
    let store = &b.store;
    assert_eq!(store.grant_secret("alice", "github").await.expect("read"), None, "never set");
    store.set_grant("alice", "github", "ghp_one").await.expect("set");
    store.set_grant("discord:1234", "github", "ghp_other").await.expect("set another user's");
    store.set_grant("alice", "drive", "ya29.drive").await.expect("set another name");
    assert_eq!(store.grant_secret("alice", "github").await.expect("read").as_deref(), Some("ghp_one"));
    b.clock.advance(Duration::from_secs(60));
    store.set_grant("alice", "github", "ghp_two").await.expect("replace");
    assert_eq!(store.grant_secret("alice", "github").await.expect("read").as_deref(), Some("ghp_two"));
    assert_eq!(store.grant_secret("discord:1234", "github").await.expect("read").as_deref(), Some("ghp_other"));
    let listed = store.list_grants(Some("alice")).await.expect("list");
    let github = listed.iter().find(|grant| grant.name == "github").expect("github listed");
    assert_eq!(github.created_at, t0(), "a replacement keeps the creation time");
    assert_eq!(github.updated_at, t0() + chrono::Duration::seconds(60), "and stamps the update");

    assert!(store.remove_grant("alice", "github").await.expect("remove"));
    assert!(!store.remove_grant("alice", "github").await.expect("remove again"), "nothing left to remove");
    assert_eq!(store.grant_secret("alice", "github").await.expect("read"), None);
    assert_eq!(store.grant_secret("alice", "drive").await.expect("read").as_deref(), Some("ya29.drive"));
}

async fn grants_are_listed_without_secrets_per_user_or_all(b: &Backend) {
    let store = &b.store;
    store.set_grant("bob", "github", "s1").await.expect("set");
    store.set_grant("alice", "slack", "s2").await.expect("set");
    store.set_grant("alice", "github", "s3").await.expect("set");
    let all = store.list_grants(None).await.expect("list all");
    let keys: Vec<(&str, &str)> = all.iter().map(|g| (g.user_id.as_str(), g.name.as_str())).collect();
    assert_eq!(keys, [("alice", "github"), ("alice", "slack"), ("bob", "github")], "by user then name");
    let alice = store.list_grants(Some("alice")).await.expect("list alice");
    assert_eq!(
        alice,
        [
            GrantInfo { user_id: "alice".into(), name: "github".into(), created_at: t0(), updated_at: t0() },
            GrantInfo { user_id: "alice".into(), name: "slack".into(), created_at: t0(), updated_at: t0() },
        ]
    );
    // A listing has no field a secret could hide in, and its serialised form shows none.
    let shown = serde_json::to_string(&all).expect("serialise");
    for secret in ["s1", "s2", "s3"] {
        assert!(!shown.contains(&format!("\"{secret}\"")), "{shown}");
    }
    assert!(store.list_grants(Some("nobody")).await.expect("list").is_empty());
}

async fn a_bad_grant_name_or_empty_user_is_refused_and_nothing_is_written(b: &Backend) {
    let store = &b.store;
    for (user, name) in [("alice", "GitHub"), ("alice", ""), ("alice", "a b"), ("", "github")] {
        let error = store.set_grant(user, name, "secret").await.expect_err("refused");
        assert!(matches!(error, StoreError::IllegalChange { what: "grant", .. }), "{error:?}");
        assert!(!error.to_string().contains("secret"), "the error never shows the secret: {error}");
    }
    let error = store.set_grant("alice", "GitHub", "x").await.expect_err("refused");
    assert!(error.to_string().contains("a-z, 0-9"), "says what a name may be: {error}");
    assert!(store.list_grants(None).await.expect("list").is_empty(), "nothing written");
}
