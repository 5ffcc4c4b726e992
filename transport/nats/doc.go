// Package nats is under construction.
package nats
