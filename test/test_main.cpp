// doctest entry point: runs every test case and ends with the line `tests: N passed, M failed`.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdio>

namespace {
int g_passed = 0, g_failed = 0;

// Counts test cases as they finish, so the closing line can be printed after the run.
struct CountingListener : doctest::IReporter {
    explicit CountingListener(const doctest::ContextOptions&) {}
    void report_query(const doctest::QueryData&) override {}
    void test_run_start() override {}
    void test_run_end(const doctest::TestRunStats&) override {}
    void test_case_start(const doctest::TestCaseData&) override {}
    void test_case_reenter(const doctest::TestCaseData&) override {}
    void test_case_end(const doctest::CurrentTestCaseStats& st) override {
        (st.testCaseSuccess ? g_passed : g_failed)++;
    }
    void test_case_exception(const doctest::TestCaseException&) override {}
    void subcase_start(const doctest::SubcaseSignature&) override {}
    void subcase_end() override {}
    void log_assert(const doctest::AssertData&) override {}
    void log_message(const doctest::MessageData&) override {}
    void test_case_skipped(const doctest::TestCaseData&) override {}
};
}  // namespace

REGISTER_LISTENER("counting", 1, CountingListener);

int main(int argc, char** argv) {
    doctest::Context context(argc, argv);
    int rc = context.run();
    if (context.shouldExit()) return rc;
    printf("tests: %d passed, %d failed\n", g_passed, g_failed);
    return rc != 0 || g_failed != 0 ? 1 : 0;
}
