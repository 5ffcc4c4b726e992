// Package amqp is under construction.
package amqp
