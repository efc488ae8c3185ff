// The ZeroMQ transport on loopback: what it says about data still on its way to a peer.
#include "runtime/collective/zmq_transport.hpp"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>
#include <zmq.hpp>

#include "runtime/security/keys.hpp"
#include "tests/support/zmq_probe.hpp"

namespace loco::collective::detail {
namespace {

using Clock = std::chrono::steady_clock;

// A payload of `n` bytes whose owner the test can watch.
Buffer payload(size_t n, std::shared_ptr<std::vector<uint8_t>>& bytes) {
  bytes = std::make_shared<std::vector<uint8_t>>(n, uint8_t{7});
  return Buffer{bytes->data(), bytes->size(), bytes};
}

Header data_header(uint64_t n) {
  Header h;
  h.type = MsgType::reduce_scatter;
  h.round_id = 1;
  h.total_n = n;
  return h;
}

// A TCP port that accepts connections in the kernel and never reads them: a peer whose
// process has stopped taking data.
struct DeafPort {
  int fd = -1;
  std::string endpoint;
  DeafPort() {
    fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&a), len) != 0 || ::listen(fd, 4) != 0 ||
        ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0)
      return;
    endpoint = "tcp://127.0.0.1:" + std::to_string(ntohs(a.sin_port));
  }
  ~DeafPort() {
    if (fd >= 0) ::close(fd);
  }
};

TEST(ZmqTransport, DataForAPeerThatDoesNotTakeItStaysUndelivered) {
  DeafPort deaf;
  ASSERT_FALSE(deaf.endpoint.empty());
  ZmqTransport a("tcp://127.0.0.1:0", std::make_shared<zmq::context_t>(1));
  const std::vector<std::string> peers{deaf.endpoint};
  a.keep_only(peers, std::chrono::milliseconds(0));
  EXPECT_FALSE(a.undelivered(deaf.endpoint));  // nothing sent yet
  std::shared_ptr<std::vector<uint8_t>> bytes;
  ASSERT_TRUE(
      a.try_send(deaf.endpoint, Channel::data, data_header(1 << 18), "a", payload(1 << 20, bytes)));
  // The peer never answers ZeroMQ's greeting: the message waits in ZeroMQ's queue.
  const auto until = Clock::now() + std::chrono::milliseconds(300);
  while (Clock::now() < until) {
    ASSERT_TRUE(a.undelivered(deaf.endpoint));
    a.wait({}, std::chrono::milliseconds(20));
  }
  EXPECT_FALSE(a.undelivered("tcp://127.0.0.1:1"));  // not a peer: nothing to tell
}

TEST(ZmqTransport, DataIsDeliveredOnceThePeersKernelHasAllOfIt) {
  ZmqTransport a("tcp://127.0.0.1:0", std::make_shared<zmq::context_t>(1));
  ZmqTransport b("tcp://127.0.0.1:0", std::make_shared<zmq::context_t>(1));
  const std::vector<std::string> peers{b.endpoint()};
  a.keep_only(peers, std::chrono::milliseconds(0));
  std::shared_ptr<std::vector<uint8_t>> bytes;
  const size_t n = size_t{16} << 20;
  ASSERT_TRUE(a.try_send(b.endpoint(), Channel::data, data_header(n / 4), "a", payload(n, bytes)));
  EXPECT_TRUE(a.undelivered(b.endpoint()));
  // b takes the message; then a's side has nothing left on its way (bounded wait).
  Message m;
  const auto deadline = Clock::now() + std::chrono::seconds(20);
  bool got = false;
  while (!got && Clock::now() < deadline) {
    got = b.try_receive(m);
    if (!got) b.wait({}, std::chrono::milliseconds(20));
  }
  ASSERT_TRUE(got);
  EXPECT_EQ(m.payload.size, n);
  while (a.undelivered(b.endpoint()) && Clock::now() < deadline)
    a.wait({}, std::chrono::milliseconds(5));
  EXPECT_FALSE(a.undelivered(b.endpoint()));
  EXPECT_EQ(bytes.use_count(), 1);  // and the transport let go of the payload
}

// Receives one message within `limit` (bounded); false if none came.
bool receive_within(ZmqTransport& t, Message& m, std::chrono::milliseconds limit) {
  const auto deadline = Clock::now() + limit;
  while (Clock::now() < deadline) {
    if (t.try_receive(m)) return true;
    t.wait({}, std::chrono::milliseconds(20));
  }
  return false;
}

TEST(ZmqTransport, WithCurveOnlyPeersHoldingTheClusterKeyGetThrough) {
  using loco::testing::ZmqProbe;
  const auto cluster = security::Settings::with_key(security::generate_key_pair());
  ZmqTransport a("tcp://127.0.0.1:0", std::make_shared<zmq::context_t>(1), cluster);
  Message m;
  // Plain TCP: the handshake fails (CURVE on one side only); nothing reaches a.
  ZmqProbe plain(a.endpoint());
  plain.send({"header", "plain", "payload"});
  EXPECT_EQ(plain.wait_handshake(std::chrono::seconds(5)), ZmqProbe::Outcome::failed);
  // Knows a's public key but holds another key pair: a's ZAP handler refuses it.
  const auto other = security::generate_key_pair();
  ZmqProbe stranger(a.endpoint(), cluster.cluster.public_key, other.public_key, other.secret_key);
  stranger.send({"header", "stranger", "payload"});
  EXPECT_EQ(stranger.wait_handshake(std::chrono::seconds(5)), ZmqProbe::Outcome::refused_auth);
  // A transport of another cluster cannot get in either.
  ZmqTransport c("tcp://127.0.0.1:0", std::make_shared<zmq::context_t>(1),
                 security::Settings::with_key(other));
  std::shared_ptr<std::vector<uint8_t>> c_bytes;
  ASSERT_TRUE(c.try_send(a.endpoint(), Channel::control, data_header(1), "c", payload(4, c_bytes)));
  // A member of the cluster does, on the same socket, in the same time.
  ZmqTransport b("tcp://127.0.0.1:0", std::make_shared<zmq::context_t>(1), cluster);
  std::shared_ptr<std::vector<uint8_t>> bytes;
  ASSERT_TRUE(b.try_send(a.endpoint(), Channel::data, data_header(4), "b", payload(16, bytes)));
  ASSERT_TRUE(receive_within(a, m, std::chrono::seconds(10)));
  EXPECT_EQ(m.sender, "b");
  EXPECT_EQ(m.payload.size, 16u);
  // And nothing else ever came: the refused peers' bytes were never delivered.
  EXPECT_FALSE(receive_within(a, m, std::chrono::milliseconds(500)));
}

// A client key (listed on the cluster key file's `client` lines) gets into the head and the
// nodes, but the collective's sockets take members only: a client cannot feed a round.
TEST(ZmqTransport, AClientKeyIsRefusedByTheCollectivesSockets) {
  using loco::testing::ZmqProbe;
  auto cluster = security::Settings::with_key(security::generate_key_pair());
  const auto client = security::generate_key_pair();
  cluster.clients.push_back(client.public_key);
  ZmqTransport a("tcp://127.0.0.1:0", std::make_shared<zmq::context_t>(1), cluster);
  ZmqProbe as_client(a.endpoint(), cluster.cluster.public_key, client.public_key,
                     client.secret_key);
  as_client.send({"header", "client", "payload"});
  EXPECT_EQ(as_client.wait_handshake(std::chrono::seconds(5)), ZmqProbe::Outcome::refused_auth);
  // The control: the cluster's own key gets in on the same socket.
  ZmqProbe as_member(a.endpoint(), cluster.cluster.public_key, cluster.cluster.public_key,
                     cluster.cluster.secret_key);
  EXPECT_EQ(as_member.wait_handshake(std::chrono::seconds(5)), ZmqProbe::Outcome::succeeded);
}

TEST(ZmqTransport, WithoutCurveAPlainPeerGetsThrough) {
  // The control case of the test above: the same probe is let in by a plain transport.
  ZmqTransport a("tcp://127.0.0.1:0", std::make_shared<zmq::context_t>(1));
  loco::testing::ZmqProbe plain(a.endpoint());
  plain.send({std::string(sizeof(Header), '\0'), "plain", "payload"});
  EXPECT_EQ(plain.wait_handshake(std::chrono::seconds(5)),
            loco::testing::ZmqProbe::Outcome::succeeded);
}

}  // namespace
}  // namespace loco::collective::detail
