// Package outboxtest is the root of the support packages for this repository's own tests
// and modules: isolated databases per test ([github.com/outboxgo/outbox/outboxtest/testdb]),
// a TCP proxy for outage tests ([github.com/outboxgo/outbox/outboxtest/testproxy]), the
// scenarios every transport passes ([github.com/outboxgo/outbox/outboxtest/transporttest])
// and the examples' checks ([github.com/outboxgo/outbox/outboxtest/exampletest]).
//
// They are public only so that the repository's nested modules can share them (a module may
// not import another module's internal packages). They carry no compatibility promise:
// anything here may change or go away in any release.
package outboxtest
