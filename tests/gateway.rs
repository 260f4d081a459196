//! The gateway (gateway/, litebase-streams-gateway) against the real server:
//! started by the harness (tests/common/gateway.rs) for each test.
