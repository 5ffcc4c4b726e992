package main

import (
	"fmt"
	"os"
	"time"

	natsserver "github.com/nats-io/nats-server/v2/server"
)

// startNATS runs a NATS server with JetStream in this process, its file store in a
// temporary directory, so that the NATS transport can be measured on a server that has
// atomic batch publish (2.12 and later) whatever the machine's server is. stop shuts it down
// and removes the store.
func startNATS() (url string, stop func(), err error) {
	dir, err := os.MkdirTemp("", "outbox-bench-nats-")
	if err != nil {
		return "", nil, err
	}
	s, err := natsserver.NewServer(&natsserver.Options{Host: "127.0.0.1", Port: -1, JetStream: true, StoreDir: dir, NoLog: true, NoSigs: true})
	if err != nil {
		_ = os.RemoveAll(dir)
		return "", nil, err
	}
	go s.Start()
	if !s.ReadyForConnections(10 * time.Second) {
		s.Shutdown()
		_ = os.RemoveAll(dir)
		return "", nil, fmt.Errorf("the embedded NATS server did not start within 10s")
	}
	return s.ClientURL(), func() {
		s.Shutdown()
		s.WaitForShutdown()
		_ = os.RemoveAll(dir)
	}, nil
}
