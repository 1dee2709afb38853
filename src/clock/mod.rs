//! Time as corral reads and writes it: deadlines that never overflow a clock, and the RFC 3339
//! timestamps of its reports.

pub(crate) mod deadline;
pub(crate) mod rfc3339;
