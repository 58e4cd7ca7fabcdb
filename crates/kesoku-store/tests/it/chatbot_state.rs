//! What chat platform adapters remember across restarts (a long-poll cursor, per-peer reply
//! tokens): values keyed by (chatbot, key), replaced in place.

use crate::backend_tests;
use crate::harness::Backend;

backend_tests!(a_chatbot_state_value_is_kept_per_chatbot_and_key_and_replaced_in_place);

async fn a_chatbot_state_value_is_kept_per_chatbot_and_key_and_replaced_in_place(b: &Backend) {
    assert_eq!(b.store.chatbot_state("wechat", "cursor").await.expect("read"), None, "never set");
    b.store.set_chatbot_state("wechat", "cursor", "buf-1").await.expect("set");
    b.store.set_chatbot_state("wechat_work", "cursor", "other").await.expect("set another chatbot's");
    b.store.set_chatbot_state("wechat", "context:wxid_a", "ctx-a").await.expect("set another key");
    assert_eq!(b.store.chatbot_state("wechat", "cursor").await.expect("read").as_deref(), Some("buf-1"));
    b.store.set_chatbot_state("wechat", "cursor", "buf-2").await.expect("replace");
    assert_eq!(b.store.chatbot_state("wechat", "cursor").await.expect("read").as_deref(), Some("buf-2"));
    assert_eq!(b.store.chatbot_state("wechat_work", "cursor").await.expect("read").as_deref(), Some("other"));
    assert_eq!(b.store.chatbot_state("wechat", "context:wxid_a").await.expect("read").as_deref(), Some("ctx-a"));
    assert_eq!(b.store.chatbot_state("wechat", "context:wxid_b").await.expect("read"), None);
}
