//! The Discord chatbot (temporary module root: helper "discord" owns this file and the lead
//! reconciles it at merge). Here only so `status` and `progress` compile on their own.

pub mod outbound;
pub mod progress;
pub mod rest;
pub mod status;
