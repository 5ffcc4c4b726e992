// Package kafka is under construction.
package kafka
