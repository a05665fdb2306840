// JobService and WorkerService over a real gRPC server on localhost (port 0), as main sets it up.
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "hyscale/v1/service.grpc.pb.h"
#include "proto/rpc.h"
#include "server/coordinator.h"
#include "server/grpc_server.h"
#include "server/stream_limiter.h"
#include "tests/server/test_util.h"

namespace hyscale::server {
namespace {

constexpr char kToken[] = "s3cret";
constexpr char kReadToken[] = "r3ad";

// How a server stream ends, read to its end.
template <typename Message, typename Reader>
grpc::StatusCode EndOf(Reader reader) {
  Message message;
  while (reader->Read(&message)) {
  }
  return reader->Finish().error_code();
}

// A unary call by method name with an empty request, waited for.
grpc::Status GenericUnaryCall(const std::shared_ptr<grpc::Channel>& channel,
                              grpc::ClientContext* context, const std::string& method,
                              grpc::ByteBuffer* response) {
  grpc::GenericStub generic(channel);
  grpc::Slice empty("", 0);
  grpc::ByteBuffer request(&empty, 1);
  std::mutex mu;
  std::condition_variable done_cv;
  bool done = false;
  grpc::Status status;
  generic.UnaryCall(context, method, grpc::StubOptions(), &request, response, [&](grpc::Status s) {
    std::lock_guard<std::mutex> lock(mu);
    status = s;
    done = true;
    done_cv.notify_all();
  });
  std::unique_lock<std::mutex> lock(mu);
  if (!done_cv.wait_for(lock, std::chrono::seconds(10), [&] { return done; })) {
    return {grpc::StatusCode::DEADLINE_EXCEEDED, "no answer"};
  }
  return status;
}

// The threads of this process, from /proc.
int ProcessThreads() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("Threads:", 0) == 0) return std::stoi(line.substr(8));
  }
  return 0;
}

class JobServiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    CoordinatorOptions options;
    options.data_dir = testing::ScratchDir();
    auto coordinator = Coordinator::Open(options, &clock_, &metrics_);
    ASSERT_TRUE(coordinator.ok()) << coordinator.status();
    coordinator_ = std::move(*coordinator);
    auto server = GrpcServer::Start(coordinator_.get(), {kToken, kReadToken},
                                    grpc::InsecureServerCredentials(), "127.0.0.1:0", &metrics_);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = std::move(*server);
    auto channel = grpc::CreateChannel("127.0.0.1:" + std::to_string(server_->port()),
                                       grpc::InsecureChannelCredentials());
    jobs_ = v1::JobService::NewStub(channel);
    workers_ = v1::WorkerService::NewStub(channel);
    channel_ = channel;
  }
  void TearDown() override {
    if (server_) server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  }

  // A context with a deadline and, unless `token` is null, the bearer token.
  static std::unique_ptr<grpc::ClientContext> Context(const char* token = kToken) {
    auto context = std::make_unique<grpc::ClientContext>();
    rpc::ClientOptions options;
    if (token != nullptr) options.token = token;
    rpc::PrepareCall(context.get(), options, std::chrono::seconds(10));
    return context;
  }

  SystemClock clock_;
  ServerMetrics metrics_{absl::Minutes(1)};
  std::unique_ptr<Coordinator> coordinator_;
  std::unique_ptr<GrpcServer> server_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::JobService::Stub> jobs_;
  std::unique_ptr<v1::WorkerService::Stub> workers_;
};

TEST_F(JobServiceTest, MutationsNeedTheToken) {
  v1::Job job;
  EXPECT_EQ(jobs_->SubmitJob(Context(nullptr).get(), testing::SubmitRequest(), &job).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(jobs_->SubmitJob(Context("wrong").get(), testing::SubmitRequest(), &job).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  ASSERT_TRUE(jobs_->SubmitJob(Context().get(), testing::SubmitRequest(), &job).ok());
  v1::CancelJobRequest cancel;
  cancel.set_job_id(job.id());
  v1::Job cancelled;
  EXPECT_EQ(jobs_->CancelJob(Context(nullptr).get(), cancel, &cancelled).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  // The read-only token reads but does not mutate.
  EXPECT_EQ(jobs_->CancelJob(Context(kReadToken).get(), cancel, &cancelled).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(
      jobs_->SubmitJob(Context(kReadToken).get(), testing::SubmitRequest(), &job).error_code(),
      grpc::StatusCode::UNAUTHENTICATED);
  v1::RegisterWorkerResponse as_reader;
  EXPECT_EQ(
      workers_
          ->RegisterWorker(Context(kReadToken).get(), testing::WorkerRequest("w", 1), &as_reader)
          .error_code(),
      grpc::StatusCode::UNAUTHENTICATED);
  v1::GetJobRequest get;
  get.set_job_id(job.id());
  v1::Job got;
  EXPECT_TRUE(jobs_->GetJob(Context(kReadToken).get(), get, &got).ok());
  EXPECT_TRUE(jobs_->GetJob(Context().get(), get, &got).ok());
  v1::ListJobsResponse list;
  EXPECT_TRUE(jobs_->ListJobs(Context(kReadToken).get(), {}, &list).ok());
  v1::ListWorkersResponse workers;
  EXPECT_TRUE(workers_->ListWorkers(Context(kReadToken).get(), {}, &workers).ok());
  // Worker RPCs are not.
  v1::RegisterWorkerResponse registered;
  EXPECT_EQ(
      workers_->RegisterWorker(Context(nullptr).get(), testing::WorkerRequest("w", 1), &registered)
          .error_code(),
      grpc::StatusCode::UNAUTHENTICATED);
  v1::HeartbeatResponse beat;
  EXPECT_EQ(workers_->Heartbeat(Context("bad").get(), {}, &beat).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  v1::ReportStatusResponse reported;
  EXPECT_EQ(workers_->ReportStatus(Context(nullptr).get(), {}, &reported).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_TRUE(jobs_->CancelJob(Context().get(), cancel, &cancelled).ok());
}

// Job specs name data paths and logs hold trainer output: with a token set, nothing is open.
TEST_F(JobServiceTest, ReadsNeedATokenWhenOneIsSet) {
  v1::Job job;
  ASSERT_TRUE(jobs_->SubmitJob(Context().get(), testing::SubmitRequest(), &job).ok());
  for (const char* token : {static_cast<const char*>(nullptr), "wrong"}) {
    v1::GetJobRequest get;
    get.set_job_id(job.id());
    v1::Job got;
    EXPECT_EQ(jobs_->GetJob(Context(token).get(), get, &got).error_code(),
              grpc::StatusCode::UNAUTHENTICATED);
    v1::ListJobsResponse list;
    EXPECT_EQ(jobs_->ListJobs(Context(token).get(), {}, &list).error_code(),
              grpc::StatusCode::UNAUTHENTICATED);
    v1::PlanJobRequest plan_request;
    *plan_request.mutable_spec() = testing::SubmitRequest().spec();
    v1::Plan plan;
    EXPECT_EQ(jobs_->PlanJob(Context(token).get(), plan_request, &plan).error_code(),
              grpc::StatusCode::UNAUTHENTICATED);
    v1::ListWorkersResponse workers;
    EXPECT_EQ(workers_->ListWorkers(Context(token).get(), {}, &workers).error_code(),
              grpc::StatusCode::UNAUTHENTICATED);
    v1::WatchJobRequest watch;
    watch.set_job_id(job.id());
    EXPECT_EQ(EndOf<v1::JobEvent>(jobs_->WatchJob(Context(token).get(), watch)),
              grpc::StatusCode::UNAUTHENTICATED);
    v1::StreamLogsRequest logs;
    logs.set_job_id(job.id());
    EXPECT_EQ(EndOf<v1::LogChunk>(jobs_->StreamLogs(Context(token).get(), logs)),
              grpc::StatusCode::UNAUTHENTICATED);
  }
}

TEST(StreamLimiterTest, CapsStreamsPerHost) {
  StreamLimiter limiter(2);
  auto first = limiter.Acquire("ipv4:10.0.0.1:1000");
  auto second = limiter.Acquire("ipv4:10.0.0.1:1001");  // another connection, same host
  ASSERT_TRUE(first.ok() && second.ok());
  EXPECT_TRUE(absl::IsResourceExhausted(limiter.Acquire("ipv4:10.0.0.1:1002").status()));
  EXPECT_TRUE(limiter.Acquire("ipv4:10.0.0.2:1000").ok());
  first->reset();
  EXPECT_TRUE(limiter.Acquire("ipv4:10.0.0.1:1003").ok());
}

// One oversized field is refused by name before it can be stored.
TEST_F(JobServiceTest, OversizedFieldsAreRefusedByName) {
  v1::Job job;
  ASSERT_TRUE(jobs_->SubmitJob(Context().get(), testing::SubmitRequest(), &job).ok());
  v1::CancelJobRequest cancel;
  cancel.set_job_id(job.id());
  cancel.set_reason(std::string(4 << 20 >> 1, 'r'));  // 2 MiB
  v1::Job cancelled;
  const grpc::Status status = jobs_->CancelJob(Context().get(), cancel, &cancelled);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(status.error_message(), "reason: 2097152 bytes exceeds the limit of 4096");
  v1::ListJobsRequest list;
  for (int i = 0; i < 5000; ++i) list.add_states(v1::JOB_STATE_RUNNING);
  v1::ListJobsResponse listed;
  const grpc::Status many = jobs_->ListJobs(Context().get(), list, &listed);
  EXPECT_EQ(many.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(many.error_message(), "states: 5000 entries exceeds the limit of 4096");
  auto request = testing::SubmitRequest();
  request.mutable_spec()->mutable_stages(0)->set_name(std::string(5000, 's'));
  const grpc::Status nested = jobs_->SubmitJob(Context().get(), request, &job);
  EXPECT_EQ(nested.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(nested.error_message(), "spec.stages[0].name: 5000 bytes exceeds the limit of 4096");
}

// Made-up method names all count under one label; real ones under their own.
TEST_F(JobServiceTest, RpcMetricsLabelOnlyKnownMethods) {
  for (int i = 0; i < 20; ++i) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    grpc::ByteBuffer response;
    EXPECT_EQ(GenericUnaryCall(channel_, &context, "/made.up.Service/Method" + std::to_string(i),
                               &response)
                  .error_code(),
              grpc::StatusCode::UNIMPLEMENTED);
  }
  v1::GetJobRequest get;
  get.set_job_id("job-none");
  v1::Job got;
  jobs_->GetJob(Context().get(), get, &got);
  const std::string text = metrics_.Render();
  EXPECT_EQ(text.find("made.up"), std::string::npos);
  EXPECT_NE(text.find("method=\"other\""), std::string::npos) << text;
  EXPECT_NE(text.find("method=\"hyscale.v1.JobService/GetJob\""), std::string::npos);
}

TEST_F(JobServiceTest, ErrorsMapToCodesAndNameFields) {
  auto request = testing::SubmitRequest();
  request.mutable_spec()->mutable_model()->set_d_model(0);
  v1::Job job;
  grpc::Status status = jobs_->SubmitJob(Context().get(), request, &job);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(status.error_message().find("spec.model.d_model: "), std::string::npos)
      << status.error_message();

  v1::GetJobRequest get;
  get.set_job_id("job-missing");
  EXPECT_EQ(jobs_->GetJob(Context().get(), get, &job).error_code(), grpc::StatusCode::NOT_FOUND);
  v1::CancelJobRequest cancel;
  cancel.set_job_id("job-missing");
  EXPECT_EQ(jobs_->CancelJob(Context().get(), cancel, &job).error_code(),
            grpc::StatusCode::NOT_FOUND);
  v1::WatchJobRequest watch;
  watch.set_job_id("job-missing");
  auto context = Context();
  auto reader = jobs_->WatchJob(context.get(), watch);
  v1::JobEvent event;
  EXPECT_FALSE(reader->Read(&event));
  EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::NOT_FOUND);
}

TEST_F(JobServiceTest, SubmitIsIdempotentAndListPages) {
  auto request = testing::SubmitRequest();
  request.set_request_id("abc");
  v1::Job first, again, other;
  ASSERT_TRUE(jobs_->SubmitJob(Context().get(), request, &first).ok());
  ASSERT_TRUE(jobs_->SubmitJob(Context().get(), request, &again).ok());
  EXPECT_EQ(first.id(), again.id());
  request.set_max_restarts(3);
  EXPECT_EQ(jobs_->SubmitJob(Context().get(), request, &other).error_code(),
            grpc::StatusCode::ALREADY_EXISTS);
  for (int i = 0; i < 4; ++i) {
    ASSERT_TRUE(jobs_->SubmitJob(Context().get(), testing::SubmitRequest(), &other).ok());
  }
  v1::ListJobsRequest list;
  list.set_page_size(3);
  v1::ListJobsResponse page;
  ASSERT_TRUE(jobs_->ListJobs(Context().get(), list, &page).ok());
  EXPECT_EQ(page.jobs_size(), 3);
  EXPECT_EQ(page.jobs(0).id(), other.id());  // newest first
  ASSERT_FALSE(page.next_page_token().empty());
  list.set_page_token(page.next_page_token());
  ASSERT_TRUE(jobs_->ListJobs(Context().get(), list, &page).ok());
  EXPECT_EQ(page.jobs_size(), 2);
  EXPECT_EQ(page.jobs(1).id(), first.id());
  EXPECT_TRUE(page.next_page_token().empty());
}

TEST_F(JobServiceTest, WorkerFlowOverGrpcAndWatchEnds) {
  v1::RegisterWorkerResponse registered;
  ASSERT_TRUE(
      workers_->RegisterWorker(Context().get(), testing::WorkerRequest("w1", 1), &registered).ok());
  EXPECT_EQ(registered.worker_id(), "w1");
  v1::StreamAssignmentsRequest open;
  open.set_worker_id("w1");
  grpc::ClientContext stream_context;
  stream_context.AddMetadata("authorization", std::string("Bearer ") + kToken);
  stream_context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
  auto assignments = workers_->StreamAssignments(&stream_context, open);

  v1::Job job;
  ASSERT_TRUE(jobs_->SubmitJob(Context().get(), testing::SubmitRequest(), &job).ok());
  v1::Assignment assignment;
  ASSERT_TRUE(assignments->Read(&assignment));
  ASSERT_TRUE(assignment.has_run());
  EXPECT_EQ(assignment.run().ref().job_id(), job.id());

  v1::WatchJobRequest watch;
  watch.set_job_id(job.id());
  auto watch_context = Context();
  auto events = jobs_->WatchJob(watch_context.get(), watch);
  v1::JobEvent event;
  ASSERT_TRUE(events->Read(&event));
  EXPECT_EQ(event.state_change().to(), v1::JOB_STATE_SCHEDULED);  // the snapshot

  v1::ReportStatusRequest report;
  report.set_worker_id("w1");
  auto* started = report.add_reports();
  *started->mutable_ref() = assignment.run().ref();
  started->set_started_pid(42);
  auto* log = report.add_reports();
  *log->mutable_ref() = assignment.run().ref();
  log->set_log("training\n");
  auto* exited = report.add_reports();
  *exited->mutable_ref() = assignment.run().ref();
  exited->mutable_exited()->set_exit_code(0);
  v1::ReportStatusResponse reported;
  ASSERT_TRUE(workers_->ReportStatus(Context().get(), report, &reported).ok());

  std::vector<v1::JobState> states;
  while (events->Read(&event)) {
    if (event.has_state_change()) states.push_back(event.state_change().to());
  }
  EXPECT_TRUE(events->Finish().ok());
  ASSERT_FALSE(states.empty());
  EXPECT_EQ(states.back(), v1::JOB_STATE_SUCCEEDED);

  v1::StreamLogsRequest logs;
  logs.set_job_id(job.id());
  auto log_context = Context();
  auto chunks = jobs_->StreamLogs(log_context.get(), logs);
  std::string text;
  v1::LogChunk chunk;
  while (chunks->Read(&chunk)) text += chunk.data();
  EXPECT_TRUE(chunks->Finish().ok());
  EXPECT_EQ(text, "training\n");

  v1::ListWorkersResponse workers;
  ASSERT_TRUE(workers_->ListWorkers(Context().get(), {}, &workers).ok());
  ASSERT_EQ(workers.workers_size(), 1);
  EXPECT_EQ(workers.workers(0).state(), v1::WORKER_STATE_ONLINE);
  stream_context.TryCancel();
  assignments->Finish();

  const std::string text_metrics = metrics_.Render();
  EXPECT_NE(
      text_metrics.find(
          "hyscale_rpc_requests_total{method=\"hyscale.v1.JobService/SubmitJob\",code=\"OK\"} 1"),
      std::string::npos)
      << text_metrics;
}

TEST_F(JobServiceTest, ShutdownEndsOpenStreams) {
  v1::Job job;
  ASSERT_TRUE(jobs_->SubmitJob(Context().get(), testing::SubmitRequest(), &job).ok());
  v1::WatchJobRequest watch;
  watch.set_job_id(job.id());
  auto watch_context = Context();
  auto events = jobs_->WatchJob(watch_context.get(), watch);
  v1::JobEvent event;
  ASSERT_TRUE(events->Read(&event));  // PENDING forever: no workers
  const auto started = std::chrono::steady_clock::now();
  server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(5));
  server_.reset();
  while (events->Read(&event)) {
  }
  EXPECT_FALSE(events->Finish().ok());
  EXPECT_LT(std::chrono::steady_clock::now() - started, std::chrono::seconds(3));
}

// Open streams hold no thread each (one completion queue serves them): a hundred watchers of one
// job cost the process no new threads, and all of them see it end.
TEST_F(JobServiceTest, WatchStreamsHoldNoThreadEach) {
  constexpr int kWatchers = 100;
  v1::Job job;
  ASSERT_TRUE(jobs_->SubmitJob(Context().get(), testing::SubmitRequest(), &job).ok());
  const int threads_before = ProcessThreads();
  std::vector<std::unique_ptr<grpc::ClientContext>> contexts;
  std::vector<std::unique_ptr<grpc::ClientReader<v1::JobEvent>>> readers;
  v1::WatchJobRequest watch;
  watch.set_job_id(job.id());
  for (int i = 0; i < kWatchers; ++i) {
    contexts.push_back(Context());
    readers.push_back(jobs_->WatchJob(contexts.back().get(), watch));
    v1::JobEvent snapshot;
    ASSERT_TRUE(readers.back()->Read(&snapshot));
  }
  EXPECT_LT(ProcessThreads() - threads_before, 10);
  v1::CancelJobRequest cancel;
  cancel.set_job_id(job.id());
  ASSERT_TRUE(jobs_->CancelJob(Context().get(), cancel, &job).ok());
  for (auto& reader : readers) {
    v1::JobEvent event;
    v1::JobState last = v1::JOB_STATE_UNSPECIFIED;
    while (reader->Read(&event)) {
      if (event.has_state_change()) last = event.state_change().to();
    }
    EXPECT_EQ(last, v1::JOB_STATE_CANCELLED);
    EXPECT_TRUE(reader->Finish().ok());
  }
}

TEST_F(JobServiceTest, HealthServiceIsOn) {
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  // grpc.health.v1.Health/Check with an empty request (service "" = the whole server): the reply
  // is a HealthCheckResponse whose status field 1 is SERVING (1), i.e. bytes 08 01.
  grpc::ByteBuffer response;
  const grpc::Status status =
      GenericUnaryCall(channel_, &context, "/grpc.health.v1.Health/Check", &response);
  ASSERT_TRUE(status.ok()) << status.error_message();
  std::vector<grpc::Slice> slices;
  ASSERT_TRUE(response.Dump(&slices).ok());
  std::string bytes;
  for (const auto& slice : slices)
    bytes.append(reinterpret_cast<const char*>(slice.begin()), slice.size());
  EXPECT_EQ(bytes, std::string("\x08\x01", 2));
}

TEST_F(JobServiceTest, ReflectionListsTheServices) {
  // grpc.reflection.v1alpha ServerReflectionInfo with list_services (field 7, ""), encoded by
  // hand: Debian ships no reflection client stubs.
  grpc::GenericStub generic(channel_);
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  grpc::CompletionQueue cq;
  auto call = generic.PrepareCall(
      &context, "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo", &cq);
  void* tag = nullptr;
  bool ok = false;
  auto step = [&](int expected) {
    EXPECT_TRUE(cq.Next(&tag, &ok));
    EXPECT_EQ(tag, reinterpret_cast<void*>(expected));
    return ok;
  };
  call->StartCall(reinterpret_cast<void*>(1));
  ASSERT_TRUE(step(1));
  grpc::Slice list_services("\x3a\x00", 2);
  grpc::ByteBuffer request(&list_services, 1);
  call->Write(request, reinterpret_cast<void*>(2));
  ASSERT_TRUE(step(2));
  call->WritesDone(reinterpret_cast<void*>(3));
  ASSERT_TRUE(step(3));
  grpc::ByteBuffer response;
  call->Read(&response, reinterpret_cast<void*>(4));
  ASSERT_TRUE(step(4));
  std::vector<grpc::Slice> slices;
  ASSERT_TRUE(response.Dump(&slices).ok());
  std::string bytes;
  for (const auto& slice : slices) {
    bytes.append(reinterpret_cast<const char*>(slice.begin()), slice.size());
  }
  EXPECT_NE(bytes.find("hyscale.v1.JobService"), std::string::npos);
  EXPECT_NE(bytes.find("hyscale.v1.WorkerService"), std::string::npos);
  EXPECT_NE(bytes.find("grpc.health.v1.Health"), std::string::npos);
  context.TryCancel();
  grpc::Status status;
  call->Finish(&status, reinterpret_cast<void*>(5));
  step(5);
  cq.Shutdown();
  while (cq.Next(&tag, &ok)) {
  }
}

}  // namespace
}  // namespace hyscale::server
