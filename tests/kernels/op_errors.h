// The ops' argument checks from the tests' side: a call must fail with a c10::Error whose message
// holds the given words (the op's name and the argument's, as checks.h promises).
#pragma once

#include <c10/util/Exception.h>
#include <gtest/gtest.h>

#include <functional>
#include <string>

namespace hyscale::test {

inline void expect_op_error(const std::function<void()>& call, const std::string& words) {
  try {
    call();
    ADD_FAILURE() << "expected an error mentioning '" << words << "'";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
  }
}

}  // namespace hyscale::test
