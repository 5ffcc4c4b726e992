//go:build !race

package outbox_test

// raceEnabled reports that the tests run under the race detector, which slows the library
// down several times over: tests that measure rates or latency skip themselves then.
const raceEnabled = false
