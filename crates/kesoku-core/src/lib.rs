//! Kesoku's vocabulary: messages and their three axes (role, type, status), the status
//! transition table, typed metadata, sessions, activations and the ledger's record, delivery
//! records, ids, filters, the phased history order, and the shape of the service's memory report.
//!
//! This crate does no I/O and knows no async runtime: it is the language every other crate
//! speaks, and the place the specification's tables become code.

pub mod activation;
pub mod delivery;
pub mod filter;
pub mod grant;
pub mod history;
pub mod ids;
pub mod memory;
pub mod message;
pub mod metadata;
pub mod session;
pub mod status;
pub mod work;

pub use activation::{
    Activation, ActivationKind, ActivationPayload, ActivationRequest, AfterPass, ExpectedResponse, Lane, LedgerEntry,
    Orchestration, Outcome, ParentRef, SessionKind, Usage,
};
pub use delivery::DeliveryRecord;
pub use filter::MessageFilter;
pub use grant::{GrantInfo, GrantKeyError, check_grant_key, check_grant_name};
pub use ids::{ActivationId, FollowUpId, JobId, MessageId, SessionId};
pub use memory::{MemoryGauge, MemoryReport};
pub use message::{Message, Phase, TurnOrigin};
pub use metadata::{Attachment, CompactionSummary, Metadata, ThreadRef, TurnMetrics};
pub use session::Session;
pub use status::{IllegalTransition, MessageType, Role, Status, UnknownValue};
pub use work::{FollowUp, FollowUpFilter, FollowUpState, Job, JobEnd, JobFilter, JobState};
