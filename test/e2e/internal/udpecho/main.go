// Command udpecho is a UDP echo server and client for the e2e tests
// (busybox's nc has no UDP mode):
//
//	udpecho serve PORT        answer every datagram with "echo:" + it
//	udpecho ask HOST:PORT MSG send MSG, print the answer (exit 1 after 2 s)
//	udpecho get HOST:PORT     HTTP/1.0 GET / over TCP, print the reply
//	                          (busybox-static's wget crashes resolving)
package main

import (
	"fmt"
	"io"
	"net"
	"os"
	"time"
)

func main() {
	if len(os.Args) < 3 {
		fmt.Fprintln(os.Stderr, "usage: udpecho serve PORT | udpecho ask HOST:PORT MSG")
		os.Exit(2)
	}
	var err error
	switch os.Args[1] {
	case "get":
		err = get(os.Args[2])
	case "serve":
		err = serve(os.Args[2])
	case "ask":
		msg := "ping"
		if len(os.Args) > 3 {
			msg = os.Args[3]
		}
		err = ask(os.Args[2], msg)
	default:
		err = fmt.Errorf("unknown mode %q", os.Args[1])
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

func serve(port string) error {
	c, err := net.ListenPacket("udp", ":"+port)
	if err != nil {
		return err
	}
	buf := make([]byte, 2048)
	for {
		n, from, err := c.ReadFrom(buf)
		if err != nil {
			return err
		}
		if _, err := c.WriteTo(append([]byte("echo:"), buf[:n]...), from); err != nil {
			return err
		}
	}
}

func ask(addr, msg string) error {
	c, err := net.Dial("udp", addr)
	if err != nil {
		return err
	}
	defer c.Close()
	if err := c.SetDeadline(time.Now().Add(2 * time.Second)); err != nil {
		return err
	}
	if _, err := c.Write([]byte(msg)); err != nil {
		return err
	}
	buf := make([]byte, 2048)
	n, err := c.Read(buf)
	if err != nil {
		return err
	}
	fmt.Println(string(buf[:n]))
	return nil
}

func get(addr string) error {
	c, err := net.DialTimeout("tcp", addr, 3*time.Second)
	if err != nil {
		return err
	}
	defer c.Close()
	if err := c.SetDeadline(time.Now().Add(3 * time.Second)); err != nil {
		return err
	}
	if _, err := c.Write([]byte("GET / HTTP/1.0\r\n\r\n")); err != nil {
		return err
	}
	b, err := io.ReadAll(c)
	if err != nil {
		return err
	}
	fmt.Print(string(b))
	return nil
}
