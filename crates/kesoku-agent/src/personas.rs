//! Configured agents (`[[agents]]`): named personas that sit in channels (seed 003, agents as
//! participants). Each has its own intro, model and tools; a channel where several sit is shared
//! under the orchestration state (`kesoku_core::Orchestration`).
//!
//! Without `[[agents]]` the one default agent (`[agent]`) answers every channel, as before. With
//! them, a channel where no configured agent sits is still answered by the default agent;
//! a channel where some sit is answered by those only.
//!
//! Membership is the access rule: an agent may read a channel (and a thread hanging off it)
//! only where it sits. It is checked when a worker loads messages, not when work is queued, so a
//! membership removed while work waits is enforced.

use serde::{Deserialize, Serialize};

use crate::subagents::AGENT_CHATBOT;

/// One `[[agents]]` entry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentPersona {
    /// Unique; people mention it as `@name` (case-insensitive); the sender of its messages.
    /// Letters, digits, `-` and `_` only, so a mention is unambiguous.
    pub name: String,
    /// Who the agent is, appended to the system prompt (the binary reads `intro_file` into it).
    #[serde(default)]
    pub intro: Option<String>,
    /// A file whose text is the intro, relative to the config (read by the binary).
    #[serde(default)]
    pub intro_file: Option<String>,
    /// The `[models.NAME]` that answers as this agent; default: `[agent] model`.
    #[serde(default)]
    pub model: Option<String>,
    /// The tools it may call, by name; absent: every configured tool.
    #[serde(default)]
    pub tools: Option<Vec<String>>,
    /// Where it sits: `"chatbot:channel"`, or `"chatbot"` / `"chatbot:*"` for every channel of a
    /// chatbot. A thread counts as the channel it hangs off as well as itself.
    #[serde(default)]
    pub channels: Vec<String>,
}

impl AgentPersona {
    /// An agent with only a name and where it sits (intro, model and tools left to the defaults).
    pub fn sitting_in(name: &str, channels: &[&str]) -> Self {
        AgentPersona {
            name: name.to_owned(),
            intro: None,
            intro_file: None,
            model: None,
            tools: None,
            channels: channels.iter().map(|c| (*c).to_owned()).collect(),
        }
    }

    /// Whether this agent sits in `chatbot_id:channel_id`.
    pub fn sits_in(&self, chatbot_id: &str, channel_id: &str) -> bool {
        self.channels.iter().any(|pattern| match pattern.split_once(':') {
            Some((chatbot, "*")) => chatbot == chatbot_id,
            Some((chatbot, channel)) => chatbot == chatbot_id && channel == channel_id,
            None => pattern == chatbot_id,
        })
    }

    /// Whether `name` is well formed (see [`AgentPersona::name`]).
    pub fn valid_name(name: &str) -> bool {
        !name.is_empty() && name.chars().all(|c| c.is_alphanumeric() || c == '-' || c == '_')
    }
}

/// Every configured agent, in config order (the order a round dispatches them).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Personas {
    list: Vec<AgentPersona>,
}

impl Personas {
    pub fn new(list: Vec<AgentPersona>) -> Self {
        Personas { list }
    }

    pub fn is_empty(&self) -> bool {
        self.list.is_empty()
    }

    pub fn all(&self) -> &[AgentPersona] {
        &self.list
    }

    /// An agent by name (case-insensitive, as mentions are).
    pub fn get(&self, name: &str) -> Option<&AgentPersona> {
        self.list.iter().find(|p| p.name.eq_ignore_ascii_case(name))
    }

    /// The agents sitting in a channel, in config order. A thread's members are those of the
    /// thread itself and of the channel it hangs off (`parent_channel_id`).
    pub fn members_of(
        &self,
        chatbot_id: &str,
        channel_id: &str,
        parent_channel_id: Option<&str>,
    ) -> Vec<&AgentPersona> {
        self.list
            .iter()
            .filter(|p| {
                p.sits_in(chatbot_id, channel_id) || parent_channel_id.is_some_and(|c| p.sits_in(chatbot_id, c))
            })
            .collect()
    }

    /// Whether the agent `name` (`None`: the default agent) may read a message of this channel.
    ///
    /// The default agent reads channels where no configured agent sits (it answers those). A
    /// configured agent reads the channels it sits in. Sub-agent sessions (chatbot `agent`) are
    /// readable by whoever the delegation named: the contract made them, not a person.
    pub fn may_read(
        &self,
        name: Option<&str>,
        chatbot_id: &str,
        channel_id: &str,
        parent_channel_id: Option<&str>,
    ) -> bool {
        if chatbot_id == AGENT_CHATBOT {
            return true;
        }
        match name {
            None => self.members_of(chatbot_id, channel_id, parent_channel_id).is_empty(),
            Some(name) => self.get(name).is_some_and(|p| {
                p.sits_in(chatbot_id, channel_id) || parent_channel_id.is_some_and(|c| p.sits_in(chatbot_id, c))
            }),
        }
    }

    /// The configured agents a text mentions (`@Name`, case-insensitive, not followed by a
    /// name character), in the order they first appear.
    pub fn mentioned_in(&self, text: &str) -> Vec<&AgentPersona> {
        let mut found: Vec<(usize, &AgentPersona)> = Vec::new();
        for persona in &self.list {
            if let Some(at) = mention_position(text, &persona.name) {
                found.push((at, persona));
            }
        }
        found.sort_by_key(|(at, _)| *at);
        found.into_iter().map(|(_, p)| p).collect()
    }
}

/// Where `@name` first appears in `text` as a whole mention.
fn mention_position(text: &str, name: &str) -> Option<usize> {
    let lower = text.to_lowercase();
    let needle = format!("@{}", name.to_lowercase());
    let mut from = 0;
    while let Some(found) = lower[from..].find(&needle) {
        let at = from + found;
        let end = at + needle.len();
        let before_ok = lower[..at].chars().next_back().is_none_or(|c| !(c.is_alphanumeric() || c == '_'));
        let after_ok = lower[end..].chars().next().is_none_or(|c| !(c.is_alphanumeric() || c == '-' || c == '_'));
        if before_ok && after_ok {
            return Some(at);
        }
        from = end;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn persona(name: &str, channels: &[&str]) -> AgentPersona {
        AgentPersona::sitting_in(name, channels)
    }

    fn team() -> Personas {
        Personas::new(vec![
            persona("Ana", &["api:room", "discord:*"]),
            persona("Ben", &["api:room"]),
            persona("Cai", &["api"]),
        ])
    }

    #[test]
    fn membership_by_channel_by_chatbot_and_through_a_thread_parent() {
        let team = team();
        let names = |list: Vec<&AgentPersona>| list.into_iter().map(|p| p.name.clone()).collect::<Vec<_>>();
        assert_eq!(names(team.members_of("api", "room", None)), ["Ana", "Ben", "Cai"]);
        assert_eq!(names(team.members_of("api", "other", None)), ["Cai"]);
        assert_eq!(names(team.members_of("discord", "42", None)), ["Ana"]);
        assert_eq!(names(team.members_of("api", "thread-9", Some("room"))), ["Ana", "Ben", "Cai"]);
        assert!(team.members_of("cli", "cli", None).is_empty());
    }

    #[test]
    fn who_may_read_what() {
        let team = team();
        assert!(team.may_read(Some("Ben"), "api", "room", None));
        assert!(!team.may_read(Some("Ben"), "api", "other", None));
        assert!(team.may_read(Some("ben"), "api", "thread-9", Some("room")));
        assert!(!team.may_read(Some("Nobody"), "api", "room", None));
        // The default agent reads only channels no configured agent sits in.
        assert!(team.may_read(None, "cli", "cli", None));
        assert!(!team.may_read(None, "api", "room", None));
        // Sub-agent sessions belong to the delegation.
        assert!(team.may_read(Some("Ben"), AGENT_CHATBOT, "sess_1", None));
    }

    #[test]
    fn mentions_are_whole_names_in_order_of_appearance() {
        let team = team();
        let names = |text: &str| team.mentioned_in(text).into_iter().map(|p| p.name.clone()).collect::<Vec<_>>();
        assert_eq!(names("@ben and @Ana, please"), ["Ben", "Ana"]);
        assert_eq!(names("mail ana@example.com or @Anabel"), Vec::<String>::new());
        assert_eq!(names("(@CAI)"), ["Cai"]);
        assert_eq!(names("no one"), Vec::<String>::new());
    }

    #[test]
    fn names_are_mentionable_words() {
        assert!(AgentPersona::valid_name("Ryan_2-b"));
        assert!(!AgentPersona::valid_name("Ryan Smith"));
        assert!(!AgentPersona::valid_name(""));
        assert!(!AgentPersona::valid_name("@Ryan"));
    }
}
